"""The Airflow-named tables exactly as Airflow's model creates them; origins in thop_table_origin.

Revision ID: thop0004
Revises: thop0003

Airflow's model names the binding tables' constraints and indexes by its metadata naming
convention (``lang_sdk_task_handler_dag_id_fkey``, ``idx_lang_sdk_task_handler_dag_file``, ...),
has an index on ``last_probed_at`` and no table comment; its later migrations drop and alter by
those names. On every existing installation, for each Airflow-named table:

* record who created it in ``thop_table_origin`` (the operator when it carries thop0001's
  comment, else Airflow), then remove that comment;
* give each constraint and index Airflow's name: an object with the same definition under
  another name is renamed (a second one with the same definition is a duplicate and is
  dropped); a unique index standing in for the unique constraint becomes the constraint; what
  is missing is created. Nothing else changes; no row is touched.

Downgrade puts the old names and the comment back on the tables the operator created.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "thop0004"
down_revision = "thop0003"
branch_labels = None
depends_on = None

ARTIFACT = "lang_sdk_task_handler_artifact"
BINDING = "lang_sdk_task_handler"
CREATED_BY = "created by taskhandler-operator"  # thop0001's table comment
OPERATOR = "taskhandler-operator"
AIRFLOW = "airflow"

# name -> pg_get_constraintdef(), as Airflow's model declares them.
CONSTRAINTS: dict[str, dict[str, str]] = {
    ARTIFACT: {
        "lang_sdk_task_handler_artifact_pkey": "PRIMARY KEY (id)",
        "lang_sdk_task_handler_artifact_bundle_fileloc_uq": (
            "UNIQUE (bundle_name, relative_fileloc_hash)"
        ),
    },
    BINDING: {
        "lang_sdk_task_handler_pkey": "PRIMARY KEY (dag_id, task_id)",
        "lang_sdk_task_handler_dag_id_fkey": (
            "FOREIGN KEY (dag_id) REFERENCES dag(dag_id) ON DELETE CASCADE"
        ),
        "lang_sdk_task_handler_artifact_id_fkey": (
            f"FOREIGN KEY (artifact_id) REFERENCES {ARTIFACT}(id)"
        ),
    },
}
# name -> columns of the plain (non-unique btree) indexes.
INDEXES: dict[str, dict[str, tuple[str, ...]]] = {
    ARTIFACT: {"idx_lang_sdk_task_handler_artifact_last_probed_at": ("last_probed_at",)},
    BINDING: {
        "idx_lang_sdk_task_handler_dag_file": ("dag_bundle_name", "dag_relative_fileloc_hash"),
        "idx_lang_sdk_task_handler_artifact_id": ("artifact_id",),
    },
}
# What thop0001 named them, for the downgrade.
OLD_NAMES: dict[str, str] = {
    "lang_sdk_task_handler_artifact_bundle_fileloc_uq": "lsth_artifact_bundle_fileloc_uq",
    "lang_sdk_task_handler_dag_id_fkey": "lsth_dag_fkey",
    "lang_sdk_task_handler_artifact_id_fkey": "lsth_artifact_fkey",
    "idx_lang_sdk_task_handler_dag_file": "idx_lsth_dag_file",
    "idx_lang_sdk_task_handler_artifact_id": "idx_lsth_artifact_id",
}


def _q(name: str) -> str:
    return str(op.get_bind().dialect.identifier_preparer.quote(name))


def _exists(name: str) -> bool:
    found = op.get_bind().execute(sa.text("SELECT to_regclass(:n)"), {"n": name}).scalar()
    return found is not None


def _comment(table: str) -> str | None:
    value = (
        op.get_bind()
        .execute(sa.text("SELECT obj_description(to_regclass(:t), 'pg_class')"), {"t": table})
        .scalar()
    )
    return None if value is None else str(value)


def _constraints(table: str) -> dict[str, str]:
    rows = op.get_bind().execute(
        sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = to_regclass(:t) AND contype <> 'n'"
        ),
        {"t": table},
    )
    return {str(r[0]): str(r[1]) for r in rows}


def _plain_indexes(table: str) -> dict[str, tuple[bool, tuple[str, ...], bool]]:
    """Indexes no constraint owns: name -> (unique, simple columns, partial or expression)."""
    rows = op.get_bind().execute(
        sa.text(
            """
            SELECT c.relname, i.indisunique,
                   ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n)
                         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                         ORDER BY k.n) AS columns,
                   (i.indpred IS NOT NULL OR i.indexprs IS NOT NULL
                    OR am.amname <> 'btree') AS special
            FROM pg_index i
            JOIN pg_class c ON c.oid = i.indexrelid
            JOIN pg_am am ON am.oid = c.relam
            WHERE i.indrelid = to_regclass(:t)
              AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
            """
        ),
        {"t": table},
    )
    return {str(r[0]): (bool(r[1]), tuple(r[2]), bool(r[3])) for r in rows}


def _conform_constraints(table: str) -> None:
    wanted = CONSTRAINTS[table]
    for name, definition in wanted.items():
        present = _constraints(table)
        if name in present:
            continue  # a different definition under Airflow's name is left for `db check`
        same = sorted(n for n, d in present.items() if d == definition and n not in wanted)
        if same:
            op.execute(f"ALTER TABLE {_q(table)} RENAME CONSTRAINT {_q(same[0])} TO {_q(name)}")
            for duplicate in same[1:]:
                op.execute(f"ALTER TABLE {_q(table)} DROP CONSTRAINT {_q(duplicate)}")
            continue
        columns = definition[definition.index("(") + 1 : definition.index(")")]
        if definition.startswith("UNIQUE"):
            wanted_columns = tuple(c.strip() for c in columns.split(","))
            stand_in = sorted(
                n
                for n, (unique, cols, special) in _plain_indexes(table).items()
                if unique and cols == wanted_columns and not special
            )
            if stand_in:
                op.execute(
                    f"ALTER TABLE {_q(table)} ADD CONSTRAINT {_q(name)} "
                    f"UNIQUE USING INDEX {_q(stand_in[0])}"
                )
                continue
        op.execute(f"ALTER TABLE {_q(table)} ADD CONSTRAINT {_q(name)} {definition}")


def _conform_indexes(table: str) -> None:
    wanted = INDEXES[table]
    for name, columns in wanted.items():
        present = _plain_indexes(table)
        if name in present:
            continue
        same = sorted(
            n
            for n, (unique, cols, special) in present.items()
            if not unique and cols == columns and not special and n not in wanted
        )
        if same:
            op.execute(f"ALTER INDEX {_q(same[0])} RENAME TO {_q(name)}")
            for duplicate in same[1:]:
                op.execute(f"DROP INDEX {_q(duplicate)}")
            continue
        op.create_index(name, table, list(columns))


def upgrade() -> None:
    op.create_table(
        "thop_table_origin",
        sa.Column("table_name", sa.String(250), nullable=False),
        sa.Column("created_by", sa.String(32), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.PrimaryKeyConstraint("table_name", name="thop_table_origin_pkey"),
    )
    origin = sa.table("thop_table_origin", sa.column("table_name"), sa.column("created_by"))
    for table in (ARTIFACT, BINDING):
        if not _exists(table):
            continue
        ours = _comment(table) == CREATED_BY
        op.execute(
            origin.insert().values(table_name=table, created_by=OPERATOR if ours else AIRFLOW)
        )
        if ours:
            op.execute(f"COMMENT ON TABLE {_q(table)} IS NULL")
        _conform_constraints(table)
        _conform_indexes(table)


def downgrade() -> None:
    rows = op.get_bind().execute(sa.text("SELECT table_name, created_by FROM thop_table_origin"))
    created = {str(r[0]) for r in rows if r[1] == OPERATOR}
    for table in (ARTIFACT, BINDING):
        if table not in created or not _exists(table):
            continue
        for name in CONSTRAINTS[table]:
            if name in OLD_NAMES and name in _constraints(table):
                op.execute(
                    f"ALTER TABLE {_q(table)} RENAME CONSTRAINT {_q(name)} TO {_q(OLD_NAMES[name])}"
                )
        for name in INDEXES[table]:
            if name not in _plain_indexes(table):
                continue
            if name in OLD_NAMES:
                op.execute(f"ALTER INDEX {_q(name)} RENAME TO {_q(OLD_NAMES[name])}")
            else:
                op.drop_index(name, table_name=table)
        op.execute(f"COMMENT ON TABLE {_q(table)} IS '{CREATED_BY}'")
    op.drop_table("thop_table_origin")
