"""Stub tasks against the task handlers an artifact bundle declares (pure; no I/O).

The rules are Airflow's (ADR-0013 Design B, ``reference/airflow-langsdk.md`` §8.5), applied per
bundle instead of per Dag file:

* every stub on one of the bundle's queues must be claimed by exactly one artifact of the
  bundle; a handler without a stub is fine;
* mapped stubs, and handlers declaring ``params: null``, are checked for presence only;
* ``positional`` handlers take all arguments, or else the ones passed without defaults, and
  any other count is an error; ``named`` handlers match by exact name, then by folded name
  (lowercase, ``_`` removed) unless the parameter says ``exact_name``; unmatched arguments and
  parameters are warnings, and a lone argument that may be the whole value is accepted;
* only top-level JSON types are compared: ``integer`` fits a ``number`` parameter, a stub that
  may be ``null`` needs a handler that accepts ``null``, and any overlap of the other types
  passes.

A Dag with any error gets ``bindings=None``: its existing rows stay untouched and its problems
are reported. Warnings never block a binding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from taskhandler_operator.airflow.arg_bindings import LiteralArgBinding, XComArgBinding, is_passed
from taskhandler_operator.airflow.serialized import DagReadProblem, DagStubs, StubTask
from taskhandler_operator.records import (
    ArgValueSchema,
    BundleProblem,
    ProblemKind,
    Severity,
    TaskHandlerArtifact,
    TaskHandlerBinding,
    TaskHandlerDeclaration,
    TaskHandlerParam,
)

ArgBinding = XComArgBinding | LiteralArgBinding


class BrokenCandidate(BaseModel):
    """An artifact of the bundle that gave no answer (rejected by the listing or a failed
    probe); named in "no artifact registers it" problems because it may be the reason."""

    model_config = ConfigDict(frozen=True)

    rel_path: str
    reason: str


class DagVerdict(BaseModel):
    """The outcome for one Dag: its bindings, or None to leave its rows untouched."""

    model_config = ConfigDict(frozen=True)

    dag_id: str
    bundle_name: str
    relative_fileloc: str
    bindings: tuple[TaskHandlerBinding, ...] | None
    errors: tuple[BundleProblem, ...] = ()
    warnings: tuple[BundleProblem, ...] = ()

    def report(self) -> str | None:
        """One readable problem list for the Dag, or None when there is nothing to say."""
        if not self.errors and not self.warnings:
            return None
        if self.errors:
            header = f"Stub tasks in {self.relative_fileloc} do not match their task handlers:"
        else:
            header = f"Stub tasks in {self.relative_fileloc} match with warnings:"
        lines = [header]
        lines += [f"- {problem.message}" for problem in self.errors]
        lines += [f"- warning: {problem.message}" for problem in self.warnings]
        return "\n".join(lines)


class ValidationResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    bundle_name: str
    verdicts: tuple[DagVerdict, ...]
    # About an artifact rather than a Dag (stored as the bundle's own problems).
    artifact_problems: tuple[BundleProblem, ...] = ()

    @property
    def problems(self) -> tuple[BundleProblem, ...]:
        per_dag = tuple(p for v in self.verdicts for p in (*v.errors, *v.warnings))
        return (*self.artifact_problems, *per_dag)

    @property
    def bindings(self) -> tuple[TaskHandlerBinding, ...]:
        return tuple(b for v in self.verdicts for b in v.bindings or ())


# A claim: the artifact (by rel_path) and the declaration it made for one (dag_id, task_id).
_Claim = tuple[str, TaskHandlerDeclaration]


def validate_bundle(
    *,
    bundle_name: str,
    queues: Iterable[str],
    dags: Iterable[DagStubs],
    artifacts: Iterable[TaskHandlerArtifact],
    broken: Iterable[BrokenCandidate] = (),
) -> ValidationResult:
    """Validate every Dag's stubs on ``queues`` against the bundle's ``artifacts``.

    Every Dag of ``dags`` gets a verdict; one with no stub on these queues gets ``bindings=()``,
    which tells the writer to remove any rows this bundle held for it. A pass hands only the
    Dags that concern its queues (``InventorySnapshot.concerning``): the others' verdicts are
    all that one, which the writer applies itself (``BundlePass.inventory_dags``). An artifact
    that declares no handler at all is a warning of its own (``artifact_problems``) and is
    named in every "no artifact registers it" error, because it is the likely reason.
    """
    artifact_list = list(artifacts)
    queue_set = frozenset(queues)
    claims = _index_claims(artifact_list)
    broken_list = sorted(broken, key=lambda b: b.rel_path)
    empty = sorted(a.relative_fileloc for a in artifact_list if not a.task_handlers)
    verdicts = [
        _validate_dag(bundle_name, queue_set, dag, claims, broken_list, empty)
        for dag in sorted(dags, key=lambda d: d.dag_id)
    ]
    return ValidationResult(
        bundle_name=bundle_name,
        verdicts=tuple(verdicts),
        artifact_problems=tuple(_empty_answer(bundle_name, path) for path in empty),
    )


EMPTY_ANSWER_CAUSE = (
    "an older Go or Java SDK runtime answers only the Dags named in the probe request's dag_ids"
)


def _empty_answer(bundle_name: str, rel_path: str) -> BundleProblem:
    return BundleProblem(
        severity="warning",
        kind="empty_answer",
        message=(
            f"Artifact {rel_path!r} in Dag bundle {bundle_name!r} registers no task handler; "
            f"if it implements stub tasks, the likely cause is that {EMPTY_ANSWER_CAUSE}"
        ),
        relative_fileloc=rel_path,
    )


def _index_claims(artifacts: Iterable[TaskHandlerArtifact]) -> dict[tuple[str, str], list[_Claim]]:
    claims: dict[tuple[str, str], list[_Claim]] = defaultdict(list)
    for artifact in sorted(artifacts, key=lambda a: a.relative_fileloc):
        for dag_id, declarations in artifact.task_handlers.items():
            for declaration in declarations:
                claims[(dag_id, declaration.task_id)].append(
                    (artifact.relative_fileloc, declaration)
                )
    return claims


class _DagChecker:
    """Collects one Dag's problems; every message starts with the Dag and task it is about."""

    def __init__(self, dag: DagStubs) -> None:
        self.dag = dag
        self.errors: list[BundleProblem] = []
        self.warnings: list[BundleProblem] = []

    def add(self, severity: Severity, kind: ProblemKind, task_id: str | None, text: str) -> None:
        subject = f"Dag {self.dag.dag_id!r}"
        if task_id is not None:
            subject += f", task {task_id!r}"
        problem = BundleProblem(
            severity=severity,
            kind=kind,
            message=f"{subject}: {text}",
            dag_id=self.dag.dag_id,
            task_id=task_id,
            relative_fileloc=self.dag.relative_fileloc,
        )
        (self.errors if severity == "error" else self.warnings).append(problem)


def _validate_dag(
    bundle_name: str,
    queues: frozenset[str],
    dag: DagStubs,
    claims: dict[tuple[str, str], list[_Claim]],
    broken: Sequence[BrokenCandidate],
    empty: Sequence[str],
) -> DagVerdict:
    checker = _DagChecker(dag)
    for read_problem in dag.problems:
        if _concerns(read_problem, queues):
            checker.add("error", "unreadable", read_problem.task_id, read_problem.message)

    bindings: list[TaskHandlerBinding] = []
    for stub in sorted(dag.stubs, key=lambda s: s.task_id):
        if stub.queue not in queues:
            continue
        found = claims.get((dag.dag_id, stub.task_id), [])
        if not found:
            checker.add("error", "unbound", stub.task_id, _unbound_text(bundle_name, broken, empty))
            continue
        if len(found) > 1:
            paths = _join_and([repr(path) for path, _ in found])
            checker.add(
                "error",
                "ambiguous",
                stub.task_id,
                f"registered by {paths} in Dag bundle {bundle_name!r}",
            )
            continue
        rel_path, declaration = found[0]
        errors_before = len(checker.errors)
        _check_arguments(checker, stub, rel_path, declaration)
        if len(checker.errors) == errors_before:
            bindings.append(
                TaskHandlerBinding(
                    dag_id=dag.dag_id,
                    task_id=stub.task_id,
                    artifact_bundle_name=bundle_name,
                    artifact_rel_path=rel_path,
                )
            )

    # Problems about the whole Dag come first, then task by task.
    errors = sorted(checker.errors, key=_problem_order)
    warnings = sorted(checker.warnings, key=_problem_order)
    return DagVerdict(
        dag_id=dag.dag_id,
        bundle_name=dag.bundle_name,
        relative_fileloc=dag.relative_fileloc,
        bindings=None if errors else tuple(bindings),
        errors=tuple(errors),
        warnings=tuple(warnings),
    )


def _concerns(problem: DagReadProblem, queues: frozenset[str]) -> bool:
    # A problem whose queue we could not read may concern any bundle.
    return problem.queue is None or problem.queue in queues


def _problem_order(problem: BundleProblem) -> tuple[bool, str]:
    return (problem.task_id is not None, problem.task_id or "")


def _unbound_text(bundle_name: str, broken: Sequence[BrokenCandidate], empty: Sequence[str]) -> str:
    text = f"no artifact in Dag bundle {bundle_name!r} registers it"
    if broken:
        listed = ", ".join(f"{b.rel_path!r} ({b.reason})" for b in broken)
        text += f"; no answer from {listed}"
    if empty:
        listed = _join_and([repr(path) for path in empty])
        text += f"; {listed} registered no task handler at all ({EMPTY_ANSWER_CAUSE}?)"
    return text


def _join_and(items: Sequence[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# --- arguments ---------------------------------------------------------------------------------


def _check_arguments(
    checker: _DagChecker, stub: StubTask, rel_path: str, declaration: TaskHandlerDeclaration
) -> None:
    params = declaration.params
    if stub.mapped or params is None:
        return
    mode = declaration.mode
    if mode is None:
        checker.add(
            "error",
            "arguments",
            stub.task_id,
            f"the task handler in {rel_path!r} binds arguments in unknown mode "
            f"{declaration.binding!r}",
        )
        return
    arguments = list(stub.arg_bindings or ())
    if mode == "positional":
        _check_positional(checker, stub.task_id, arguments, params)
    else:
        _check_named(checker, stub.task_id, arguments, params)


def _check_positional(
    checker: _DagChecker,
    task_id: str,
    arguments: list[ArgBinding],
    params: list[TaskHandlerParam],
) -> None:
    passed = [a for a in arguments if is_passed(a)]
    if len(arguments) == len(params):
        bound = arguments
    elif len(passed) == len(params):
        bound = passed
    else:
        checker.add(
            "error",
            "arguments",
            task_id,
            f"passes {len(arguments)} argument(s) ({len(passed)} without defaults), "
            f"the task handler takes {len(params)}",
        )
        return
    for argument, param in zip(bound, params, strict=True):
        _check_pair(checker, task_id, argument, param)


def fold_name(name: str) -> str:
    """Names compared loosely: case and underscores ignored (``table_name`` ~ ``TableName``)."""
    return name.lower().replace("_", "")


def _check_named(
    checker: _DagChecker,
    task_id: str,
    arguments: list[ArgBinding],
    params: list[TaskHandlerParam],
) -> None:
    by_name = {a.name: a for a in arguments}
    matched: list[tuple[ArgBinding, TaskHandlerParam]] = []
    claimed: set[str] = set()
    unfilled: list[str] = []
    for index, param in enumerate(params):
        argument = _match_param(param, arguments, by_name)
        if argument is None:
            if param.required is not False:  # Design A may say the handler has a default
                unfilled.append(repr(param.name) if param.name is not None else f"#{index}")
            continue
        matched.append((argument, param))
        claimed.add(argument.name)

    passed = [a for a in arguments if is_passed(a)]
    if not matched and _may_be_whole_value(passed, params):
        return
    for argument, param in matched:
        _check_pair(checker, task_id, argument, param)
    for argument in passed:
        if argument.name not in claimed:
            checker.add(
                "warning",
                "arguments",
                task_id,
                f"argument {argument.name!r} is not taken by the task handler",
            )
    for label in unfilled:
        checker.add(
            "warning",
            "arguments",
            task_id,
            f"the task handler's parameter {label} gets no argument",
        )


def _match_param(
    param: TaskHandlerParam, arguments: list[ArgBinding], by_name: dict[str, ArgBinding]
) -> ArgBinding | None:
    if param.name is None:
        return None
    exact = by_name.get(param.name)
    if exact is not None or param.exact_name:
        return exact
    folded = fold_name(param.name)
    candidates = [a for a in arguments if fold_name(a.name) == folded]
    # Two arguments folding to the same name: neither is a safe match.
    return candidates[0] if len(candidates) == 1 else None


def _may_be_whole_value(passed: list[ArgBinding], params: list[TaskHandlerParam]) -> bool:
    """One argument carrying the whole struct the handler's named params are fields of."""
    if len(passed) != 1 or not params or any(p.exact_name for p in params):
        return False
    types = schema_types(passed[0].value_schema)
    return types is None or "object" in types


def _check_pair(
    checker: _DagChecker, task_id: str, argument: ArgBinding, param: TaskHandlerParam
) -> None:
    mismatch = compare_value_schemas(argument.value_schema, param.value_schema)
    if mismatch is not None:
        stub_types, handler_types = mismatch
        checker.add(
            "error",
            "arguments",
            task_id,
            f"argument {argument.name!r} is {' or '.join(stub_types)}, "
            f"the task handler takes {' or '.join(handler_types)}",
        )


# --- JSON Schema, top level only -------------------------------------------------------------


def json_type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def schema_types(schema: ArgValueSchema | None) -> tuple[str, ...] | None:
    """The top-level JSON types a schema allows, or None when that cannot be said simply.

    Read from ``type`` (a name or a list), else the union over ``anyOf``/``oneOf`` branches,
    else the types of ``const``/``enum`` values. Any other shape (``$ref``, ``allOf``, ...) is
    not compared.
    """
    if not isinstance(schema, dict):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list):
        if declared and all(isinstance(t, str) for t in declared):
            return _dedupe(declared)
        return None
    if declared is not None:
        return None
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            union: list[str] = []
            for branch in branches:
                branch_types = schema_types(branch)
                if branch_types is None:
                    return None
                union.extend(branch_types)
            return _dedupe(union)
    if "const" in schema:
        return (json_type_of(schema["const"]),)
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return _dedupe(json_type_of(v) for v in enum)
    return None


def compare_value_schemas(
    stub_schema: ArgValueSchema | None, handler_schema: ArgValueSchema | None
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """None when the argument fits the parameter, else (stub types, handler types)."""
    stub_types = schema_types(stub_schema)
    handler_types = schema_types(handler_schema)
    if stub_types is None or handler_types is None:
        return None
    accepted = set(handler_types)
    if "number" in accepted:
        accepted.add("integer")
    null_ok = "null" not in stub_types or "null" in handler_types
    non_null = [t for t in stub_types if t != "null"]
    types_ok = not non_null or any(t in accepted for t in non_null)
    if null_ok and types_ok:
        return None
    return stub_types, handler_types
