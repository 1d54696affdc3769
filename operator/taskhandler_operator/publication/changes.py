"""What a publication changes: the bindings added, removed, moved or changed (pure; no I/O).

A :class:`BindingRow` is one row of ``lang_sdk_task_handler`` as a person reads it: the task,
the artifact it is bound to (path and cache digest, from the artifact row) and what that
artifact declares for it (binding mode and parameters, in the stored Design-B form), plus the
Dag file columns the row carries. :func:`compute_change` compares the published rows with the
ones a pass would write; :func:`proposed_rows` says which those are, from the published rows
and the pass's wanted bindings, exactly as the write path replaces them (by Dag).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from taskhandler_operator.records import TaskHandlerDeclaration

__all__ = [
    "STORED_PARAM_KEYS",
    "BindingChange",
    "BindingRow",
    "ChangeCounts",
    "ChangeKind",
    "ChangeSet",
    "ChangeSummary",
    "compute_change",
    "declared",
    "proposed_rows",
    "same_placement",
]

ChangeKind = Literal["added", "removed", "moved", "changed"]
#: The order changes are counted and listed in: what takes a task away first.
KINDS: tuple[ChangeKind, ...] = ("removed", "moved", "changed", "added")
#: The keys of a stored parameter (Design B's ``TaskHandlerParam``), as the artifact row has them.
STORED_PARAM_KEYS: tuple[str, ...] = ("name", "value_schema", "exact_name")


class BindingRow(BaseModel):
    """One published (or proposed) binding, with what its artifact declares for it."""

    model_config = ConfigDict(frozen=True)

    dag_id: str
    task_id: str
    artifact_path: str
    # The artifact row's cache digest (its content), None when the artifact has none.
    artifact_digest: str | None = None
    # What the artifact declares for this task: binding mode and stored parameters.
    binding: str | None = None
    params: list[dict[str, Any]] | None = None
    # The row's Dag file columns (needed to restore the row exactly).
    dag_bundle_name: str = ""
    dag_fileloc: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.dag_id, self.task_id)

    def placement(self) -> tuple[str, str, str, str, str]:
        """What the binding row itself holds (not what its artifact declares)."""
        return (
            self.dag_id,
            self.task_id,
            self.artifact_path,
            self.dag_bundle_name,
            self.dag_fileloc,
        )

    def describe(self) -> str:
        digest = f" @{self.artifact_digest}" if self.artifact_digest else ""
        return f"{self.artifact_path}{digest}"


def declared(
    handlers: Mapping[str, Sequence[TaskHandlerDeclaration | Mapping[str, Any]]],
    dag_id: str,
    task_id: str,
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """The binding mode and stored parameters ``handlers`` declare for ``(dag_id, task_id)``,
    normalized the same whether read from a probe's answer or from an artifact row's JSON."""
    for item in handlers.get(dag_id, ()):
        decl = (
            item
            if isinstance(item, TaskHandlerDeclaration)
            else TaskHandlerDeclaration.model_validate(item)
        )
        if decl.task_id != task_id:
            continue
        params = (
            None
            if decl.params is None
            else [p.model_dump(mode="json", include=set(STORED_PARAM_KEYS)) for p in decl.params]
        )
        return decl.mode, params
    return None, None


class BindingChange(BaseModel):
    """One binding that differs: ``before`` is the published row, ``after`` the new one."""

    model_config = ConfigDict(frozen=True)

    kind: ChangeKind
    dag_id: str
    task_id: str
    before: BindingRow | None = None
    after: BindingRow | None = None

    def line(self) -> str:
        """One line for people: ``moved etl/load: a.jar @d1 -> b.jar @d2``."""
        task = f"{self.dag_id}/{self.task_id}"
        if self.kind == "added" and self.after is not None:
            return f"added {task}: {self.after.describe()}"
        if self.kind == "removed" and self.before is not None:
            return f"removed {task}: was {self.before.describe()}"
        assert self.before is not None and self.after is not None
        line = f"{self.kind} {task}: {self.before.describe()} -> {self.after.describe()}"
        what = _what_changed(self.before, self.after)
        return f"{line} ({', '.join(what)})" if what and self.kind == "changed" else line


def _what_changed(before: BindingRow, after: BindingRow) -> list[str]:
    what = []
    if before.artifact_digest != after.artifact_digest:
        what.append("content")
    if before.binding != after.binding:
        what.append(f"binding {before.binding} -> {after.binding}")
    if before.params != after.params:
        what.append("parameters")
    if (before.dag_bundle_name, before.dag_fileloc) != (after.dag_bundle_name, after.dag_fileloc):
        what.append("Dag file")
    return what


class ChangeCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    added: int = 0
    removed: int = 0
    moved: int = 0
    changed: int = 0

    @property
    def total(self) -> int:
        return self.added + self.removed + self.moved + self.changed

    def describe(self) -> str:
        """``1 removed, 2 moved`` (the kinds with a change), or ``no change``."""
        parts = [f"{getattr(self, kind)} {kind}" for kind in KINDS if getattr(self, kind)]
        return ", ".join(parts) or "no change"


class ChangeSummary(BaseModel):
    """A change set bounded for a status or a message: counts and the first lines."""

    model_config = ConfigDict(frozen=True)

    counts: ChangeCounts
    first: tuple[str, ...] = ()
    omitted: int = 0

    def describe(self) -> str:
        text = self.counts.describe()
        if self.first:
            text += ": " + "; ".join(self.first)
            if self.omitted:
                text += f"; and {self.omitted} more"
        return text


class ChangeSet(BaseModel):
    """The bindings a publication changes, ordered: removals first, then by task."""

    model_config = ConfigDict(frozen=True)

    changes: tuple[BindingChange, ...] = Field(default_factory=tuple)

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def counts(self) -> ChangeCounts:
        tally = {kind: 0 for kind in KINDS}
        for change in self.changes:
            tally[change.kind] += 1
        return ChangeCounts(**tally)

    def summary(self, limit: int = 5) -> ChangeSummary:
        lines = [c.line() for c in self.changes[: max(0, limit)]]
        return ChangeSummary(
            counts=self.counts(), first=tuple(lines), omitted=max(0, len(self.changes) - limit)
        )

    def lines(self) -> list[str]:
        """One binding a line (the CLI's text output)."""
        return [c.line() for c in self.changes]

    def of_kind(self, *kinds: ChangeKind) -> tuple[BindingChange, ...]:
        return tuple(c for c in self.changes if c.kind in kinds)

    def keys(self) -> frozenset[tuple[str, str, str]]:
        """(kind, dag_id, task_id) of every change."""
        return frozenset((c.kind, c.dag_id, c.task_id) for c in self.changes)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any]) -> ChangeSet:
        if isinstance(text, Mapping):
            return cls.model_validate(text)
        return cls.model_validate_json(text)


def _order(change: BindingChange) -> tuple[int, str, str]:
    return (KINDS.index(change.kind), change.dag_id, change.task_id)


def compute_change(
    published_rows: Iterable[BindingRow], proposed_rows: Iterable[BindingRow]
) -> ChangeSet:
    """What publishing ``proposed_rows`` changes where ``published_rows`` are published."""
    before = {row.key: row for row in published_rows}
    after = {row.key: row for row in proposed_rows}
    changes: list[BindingChange] = []
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        kind: ChangeKind
        if old is None:
            kind = "added"
        elif new is None:
            kind = "removed"
        elif old.artifact_path != new.artifact_path:
            kind = "moved"
        elif old != new:
            kind = "changed"
        else:
            continue
        changes.append(
            BindingChange(kind=kind, dag_id=key[0], task_id=key[1], before=old, after=new)
        )
    return ChangeSet(changes=tuple(sorted(changes, key=_order)))


def same_placement(a: Iterable[BindingRow], b: Iterable[BindingRow]) -> bool:
    """Whether two binding sets hold the same rows (tasks, artifact paths, Dag files),
    whatever their artifacts declare now."""
    return sorted(r.placement() for r in a) == sorted(r.placement() for r in b)


def proposed_rows(
    published: Iterable[BindingRow],
    reconciled_dag_ids: Iterable[str],
    wanted: Iterable[BindingRow],
    held_elsewhere: Iterable[tuple[str, str]] = (),
) -> list[BindingRow]:
    """The bundle's rows after a pass: the published rows of the Dags the pass leaves alone
    (a Dag with problems keeps its rows), and the wanted rows of the Dags it reconciles but
    for those another bundle holds (a conflict is never overwritten)."""
    reconciled = frozenset(reconciled_dag_ids)
    elsewhere = frozenset(held_elsewhere)
    kept = [row for row in published if row.dag_id not in reconciled]
    new = [row for row in wanted if row.dag_id in reconciled and row.key not in elsewhere]
    return sorted([*kept, *new], key=lambda r: r.key)
