"""Stored answers in Design B's value domain; the runtime's own answer kept where it matters.

Revision ID: thop0005
Revises: thop0004

Until now ``task_handlers`` held the answer as the runtime sent it, so a Go SDK's
``"binding": "named_or_whole"`` (or a TypeScript branch's ``named_open``, or Design A's
``required``) reached a column Airflow's model reads with ``binding`` in {positional, named}
only. This revision adds ``thop_artifact_probe.declared_task_handlers`` and rewrites every
stored answer the way the write path now stores it: ``named_or_whole``/``named_open`` become
``named``, a parameter keeps exactly ``name``, ``value_schema`` and ``exact_name``, and a
declaration in an unknown mode is left out. Where that loses something validation reads (an
unknown mode, ``required``), the original goes to ``declared_task_handlers``. Rows that are
not answers at all (another tool's) are left as they are. The rule is spelled out here rather
than imported: a migration is history.

Only rows the operator wrote are rewritten: every row of a table the operator created
(``thop_table_origin``), and in a table Airflow created only the rows with a
``thop_artifact_probe`` row beside them. A row Airflow wrote (its model test stores ``required``
on parameters) stays exactly as Airflow wrote it: the operator reads that shape as it is.

Downgrade puts the kept originals back and drops the column (``named_or_whole`` stays
``named``: validation reads both the same).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "thop0005"
down_revision = "thop0004"
branch_labels = None
depends_on = None

NAMED = frozenset({"named", "named_or_whole", "named_open"})
PARAM_KEYS = ("name", "value_schema", "exact_name")


def _param(raw: Any) -> tuple[dict[str, Any], bool] | None:
    if not isinstance(raw, dict):
        return None
    lossy = raw.get("required") is not None
    return {
        "name": raw.get("name"),
        "value_schema": raw.get("value_schema"),
        "exact_name": raw.get("exact_name", False),
    }, lossy


def _declaration(raw: Any) -> tuple[dict[str, Any] | None, bool] | None:
    """(stored form or None when left out, lossy); None when ``raw`` is not a declaration."""
    if not isinstance(raw, dict) or not isinstance(raw.get("task_id"), str):
        return None
    binding = raw.get("binding", "positional")
    if binding == "positional":
        mode = "positional"
    elif binding in NAMED:
        mode = "named"
    else:
        return None, True
    params = raw.get("params")
    if params is None:
        return {"task_id": raw["task_id"], "binding": mode, "params": None}, False
    if not isinstance(params, list):
        return None
    converted = [_param(p) for p in params]
    if any(c is None for c in converted):
        return None
    checked = [c for c in converted if c is not None]
    stored = {"task_id": raw["task_id"], "binding": mode, "params": [c[0] for c in checked]}
    return stored, any(c[1] for c in checked)


def normalize(raw: Any) -> tuple[dict[str, Any], bool] | None:
    """(Design-B form, lossy) of a stored answer; None when it is not an answer."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    lossy = False
    for dag_id, declarations in raw.items():
        if not isinstance(declarations, list):
            return None
        kept: list[dict[str, Any]] = []
        for declaration in declarations:
            converted = _declaration(declaration)
            if converted is None:
                return None
            stored, lost = converted
            lossy = lossy or lost
            if stored is not None:
                kept.append(stored)
        out[dag_id] = kept
    return out, lossy


def _rows_the_operator_wrote(bind: sa.Connection) -> list[Any]:
    created_by = bind.execute(
        sa.text(
            "SELECT created_by FROM thop_table_origin "
            "WHERE table_name = 'lang_sdk_task_handler_artifact'"
        )
    ).scalar()
    query = "SELECT a.id, a.task_handlers, a.last_probed_at FROM lang_sdk_task_handler_artifact a"
    if created_by != "taskhandler-operator":
        query += " WHERE EXISTS (SELECT 1 FROM thop_artifact_probe p WHERE p.artifact_id = a.id)"
    return list(bind.execute(sa.text(query)).all())


def upgrade() -> None:
    op.add_column("thop_artifact_probe", sa.Column("declared_task_handlers", sa.JSON()))
    bind = op.get_bind()
    rows = _rows_the_operator_wrote(bind)
    for artifact_id, handlers, probed_at in rows:
        normalized = normalize(handlers)
        if normalized is None or normalized[0] == handlers:
            continue
        stored, lossy = normalized
        bind.execute(
            sa.text(
                "UPDATE lang_sdk_task_handler_artifact SET task_handlers = CAST(:h AS json) "
                "WHERE id = :id"
            ),
            {"h": json.dumps(stored, sort_keys=True), "id": artifact_id},
        )
        if lossy:
            bind.execute(
                sa.text(
                    "INSERT INTO thop_artifact_probe (artifact_id, revision, probed_at, "
                    "declared_task_handlers) VALUES (:id, NULL, :at, CAST(:h AS json)) "
                    "ON CONFLICT (artifact_id) DO UPDATE "
                    "SET declared_task_handlers = excluded.declared_task_handlers"
                ),
                {"id": artifact_id, "at": probed_at, "h": json.dumps(handlers, sort_keys=True)},
            )


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT a.id, a.task_handlers, p.declared_task_handlers "
            "FROM lang_sdk_task_handler_artifact a "
            "JOIN thop_artifact_probe p ON p.artifact_id = a.id "
            "WHERE p.declared_task_handlers IS NOT NULL"
        )
    ).all()
    for artifact_id, handlers, declared in rows:
        normalized = normalize(declared)
        # Only where the row still is that answer (nobody rewrote it since).
        if normalized is not None and normalized[0] == handlers:
            bind.execute(
                sa.text(
                    "UPDATE lang_sdk_task_handler_artifact SET task_handlers = CAST(:h AS json) "
                    "WHERE id = :id"
                ),
                {"h": json.dumps(declared, sort_keys=True), "id": artifact_id},
            )
    op.drop_column("thop_artifact_probe", "declared_task_handlers")
