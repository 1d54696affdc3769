"""``make demo``: the product end to end on an embedded default, with real parts only.

There is no Kubernetes controller yet, so this script drives the reconcile pass's steps
(``taskhandler_operator.reconcile.steps``) itself, with local ports: the bundle folders as the
source and the real probe driver as a local process. It builds the Go, Java and TypeScript test
runtimes with the real toolchains, lays them out as three artifact bundles, shows the real
``taskhandler-operator`` CLI on them (``inspect``, ``plan``), probes them, starts a throwaway
PostgreSQL with Airflow 3.3.2's own schema, migrates it with ``taskhandler-operator db
upgrade``, lets Airflow write a Dag whose tasks become stubs, then validates, writes and reads
the bindings. A second pass over unchanged bundles writes nothing, and a changed artifact that
drops a handler keeps the old bindings. Everything it starts is stopped and removed at the end,
on error and on Ctrl-C too. The example data and the dev servers are ``taskhandler_operator.
devenv``; every decision is the package's. This script only orchestrates and prints.

Run it with the project's interpreter: ``.venv/bin/python hack/demo.py`` (``make demo``).
Exit status: 0 when every step did what it should, 1 when a step failed (the message names the
step), 130 when interrupted. See ``docs/demo.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from sqlalchemy import Engine, literal_column, select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_operator.airflow.arg_bindings import XComArgBinding
from taskhandler_operator.airflow.serialized import StubTask
from taskhandler_operator.artifacts.planner import ProbePlan
from taskhandler_operator.db.engine import create_engine, create_sync_engine
from taskhandler_operator.db.tables import artifact_table, binding_table, problem_table
from taskhandler_operator.db.write_models import PassResult
from taskhandler_operator.devenv.orders_example import (
    BUNDLES,
    DAG_FILE,
    DAG_ID,
    DAG_SOURCE,
    RENAMED_HANDLERS,
    STUB_ARGUMENTS,
    WORKLOAD_TASKS,
    ExampleBundle,
    execute_task,
)
from taskhandler_operator.devenv.postgres import (
    AIRFLOW_VERSION,
    AirflowCli,
    PostgresServer,
    ensure_airflow_venv,
    reserialize_dags,
)
from taskhandler_operator.devenv.runtimes import build_runtime
from taskhandler_operator.devenv.serialized_dags import add_stub_fields
from taskhandler_operator.reconcile import steps
from taskhandler_operator.reconcile.local import LocalFolderSyncer, SubprocessProber, cli_command
from taskhandler_operator.reconcile.models import (
    BundleSpec,
    Listed,
    Planned,
    ProbeAccepted,
    Probed,
    SyncedRevision,
)
from taskhandler_operator.reconcile.ports import SystemClock
from taskhandler_operator.reconcile.store import DatabaseStore, NothingKnown
from taskhandler_operator.records import BundleOwner, TaskHandlerDeclaration
from taskhandler_operator.scheduler import (
    attach_task_handlers,
    explain_unbound_sync,
    resolve_task_handlers_sync,
)
from taskhandler_operator.validation import DagVerdict, schema_types

DATABASE: Final = "airflow"
MAX_LINE: Final = 140
PROBE_TIMEOUT: Final = 120.0
CLI_TIMEOUT: Final = 120.0
AIRFLOW_MIGRATE_TIMEOUT: Final = 300.0

T = TypeVar("T")


# --- output ---------------------------------------------------------------------------------


class Unexpected(Exception):
    """A step ran but did not show what it should have."""


class StepFailed(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


def say(line: str = "", indent: int = 0) -> None:
    text = " " * indent + line
    if len(text) > MAX_LINE:
        text = text[: MAX_LINE - 1] + "…"
    print(text, flush=True)


def say_block(text: str, indent: int = 4) -> None:
    for line in text.rstrip("\n").splitlines():
        say(line, indent)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: int = 4) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    for row in (headers, *rows):
        say("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), indent)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def describe_types(schema: Mapping[str, Any] | None) -> str:
    types = schema_types(dict(schema) if schema is not None else None)
    return "|".join(types) if types else "any"


def describe_declaration(declaration: TaskHandlerDeclaration) -> str:
    params = []
    for index, param in enumerate(declaration.params or ()):
        name = param.name if param.name is not None else f"#{index}"
        exact = " (exact)" if param.exact_name else ""
        params.append(f"{name}: {describe_types(param.value_schema)}{exact}")
    return f"{declaration.binding}({', '.join(params)})"


def describe_arguments(stub: StubTask) -> str:
    parts = []
    for arg in stub.arg_bindings or ():
        if isinstance(arg, XComArgBinding):
            kind, default = f"xcom {arg.task_id}", ""
        else:
            kind, default = compact(arg.value), (", default" if arg.from_default else "")
        parts.append(f"{arg.name}={kind} ({describe_types(arg.value_schema)}{default})")
    return "; ".join(parts) or "-"


# --- the demo -------------------------------------------------------------------------------


@dataclass
class BundleRun:
    """One bundle's pass up to the database: sync, list, plan and probe."""

    bundle: ExampleBundle
    spec: BundleSpec
    synced: SyncedRevision
    listed: Listed
    planned: Planned
    probed: Probed


@dataclass
class Database:
    url: str
    engine: AsyncEngine  # the operator's side: inventory, write path, known artifacts
    sync_engine: Engine  # the scheduler's side (Airflow's scheduler is synchronous)


class Demo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bundle_root = root / "bundles"
        self.timings: list[tuple[str, float, str]] = []
        self.cli = list(cli_command())
        # One event loop for the whole run: the async engine's connections belong to it.
        self.runner = asyncio.Runner()
        self.server: PostgresServer | None = None
        self.database: Database | None = None
        self.store: DatabaseStore | None = None
        self.prober = SubprocessProber(answer_timeout=PROBE_TIMEOUT, scratch_root=root)
        self.clock = SystemClock()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(work)

    @property
    def db_store(self) -> DatabaseStore:
        if self.store is None:
            raise RuntimeError("the database is not started")
        return self.store

    # -- plumbing

    def shown(self, text: str) -> str:
        """Temporary paths are long and differ per run: show them as $DEMO."""
        return text.replace(str(self.root), "$DEMO")

    @property
    def db(self) -> Database:
        if self.database is None:
            raise RuntimeError("the database is not started")
        return self.database

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        say()
        say(f"=== {title} " + "=" * max(3, 92 - len(title)))
        started = time.monotonic()
        outcome = "ok"
        try:
            yield
        except StepFailed:
            outcome = "failed"
            raise
        except Exception as exc:
            outcome = "failed"
            raise StepFailed(title, f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            outcome = "interrupted"
            raise
        finally:
            self.timings.append((title, time.monotonic() - started, outcome))

    def say_command(self, args: Sequence[str]) -> None:
        """The command as typed, wrapped with `\\` (never cut: it is what a reader copies)."""
        words: list[str] = []
        for arg in (self.shown(a) for a in args):
            option = bool(words) and words[-1].startswith("--") and " " not in words[-1]
            if option and not arg.startswith("--"):
                words[-1] += " " + arg  # keep an option with its value
                continue
            words.append(arg)
        line = "  $ taskhandler-operator"
        for word in words:
            if len(line) + 1 + len(word) > MAX_LINE - 2:
                print(line + " \\", flush=True)
                line = "      " + word
            else:
                line += " " + word
        print(line, flush=True)

    def run_cli(
        self, *args: str, expect: int | None = 0, timeout: float = CLI_TIMEOUT, show: bool = True
    ) -> subprocess.CompletedProcess[str]:
        self.say_command(args)
        proc = subprocess.run(
            [*self.cli, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if expect is not None and proc.returncode != expect:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise Unexpected(
                f"`taskhandler-operator {args[0]}` exited {proc.returncode} (expected {expect}): "
                + self.shown(" | ".join(tail))
            )
        if show and proc.stdout.strip():
            say_block(self.shown(proc.stdout))
        return proc

    def bundle_dir(self, bundle: ExampleBundle) -> Path:
        return self.bundle_root / bundle.name

    # -- step 1

    def build_bundles(self) -> None:
        say("Building the test runtimes with the real toolchains (cached in $THOP_CACHE/runtimes)")
        rows = []
        for bundle in BUNDLES:
            started = time.monotonic()
            self.install_artifact(bundle, build_runtime(bundle.language.value, bundle.handlers))
            size = (self.bundle_dir(bundle) / bundle.rel_path).stat().st_size
            declares = ", ".join(
                f"{dag_id}.{d['task_id']}"
                for dag_id, decls in bundle.handlers.items()
                for d in decls
            )
            rows.append(
                (
                    bundle.name,
                    bundle.language.value,
                    bundle.queue,
                    bundle.rel_path,
                    f"{size:,}",
                    declares,
                    f"{time.monotonic() - started:.1f} s",
                )
            )
        say(f"One artifact bundle per language under {self.shown(str(self.bundle_root))}:")
        table(("BUNDLE", "LANGUAGE", "QUEUE", "ARTIFACT", "BYTES", "DECLARES", "BUILD"), rows)

    def install_artifact(self, bundle: ExampleBundle, built: Path) -> None:
        """Copy a built artifact into its bundle folder; copy2 keeps the Go execute bit."""
        target = self.bundle_dir(bundle) / bundle.rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.new")
        shutil.copy2(built, staging)
        staging.replace(target)  # a reader never sees half a file

    # -- step 2, and the first half of every later pass

    def spec(self, bundle: ExampleBundle) -> BundleSpec:
        owner = BundleOwner(cluster_id="demo", namespace="demo", name=bundle.name, uid=bundle.name)
        return BundleSpec(
            bundle_name=bundle.name, language=bundle.language, queues=(bundle.queue,), owner=owner
        )

    def probe_pass(self, bundle: ExampleBundle, *, inspect: bool = False) -> BundleRun:
        """sync, list, plan against the stored answers (none before the database exists) and
        probe what changed, with the reconcile steps; the CLI shows the same plan."""
        root = self.bundle_dir(bundle)
        spec = self.spec(bundle)
        say(f"[{bundle.name}] {bundle.language.value} bundle serving queue {bundle.queue!r}")
        synced = self.run(steps.sync(LocalFolderSyncer(root), spec))
        listed = self.run(steps.list_bundle(spec, synced))
        known = self.run(self.store.known_artifacts(bundle.name)) if self.store else []
        if self.store is not None:
            say(f"load_known_artifacts: {len(known)} stored artifact(s) -> known.json", 2)
        if inspect:
            self.run_cli("inspect", str(root), "--language", bundle.language.value)
        known_file = self.root / f"known-{bundle.name}.json"
        known_file.write_text(json.dumps([k.model_dump(mode="json") for k in known], indent=1))
        shown_plan = self.run_cli(
            "plan", str(root), "--bundle-name", bundle.name, "--known", str(known_file)
        )
        planned = self.run(steps.plan(self.store or NothingKnown(), spec, listed))
        check_plan_agrees(shown_plan.stdout, planned.plan)
        if planned.plan.rejected:
            raise Unexpected(
                f"{bundle.name}: rejected {[c.rel_path for c in planned.plan.rejected]}"
            )
        probed = self.run(steps.probe(self.prober, self.clock, spec, synced, planned))
        for failure in probed.failures:
            raise Unexpected(f"probe of {failure.rel_path} failed: {failure.reason}")
        for accepted in probed.accepted:
            self.show_probe(accepted)
        return BundleRun(bundle, spec, synced, listed, planned, probed)

    def show_probe(self, accepted: ProbeAccepted) -> None:
        """What SubprocessProber read: the summary (termination message and stdout, equal) and
        the result line after the marker, accepted because its SHA-256 matches the summary."""
        self.say_command(accepted.command)
        summary = accepted.summary
        if summary is None:
            raise Unexpected(f"probe of {accepted.rel_path} has no summary")
        say(
            f"exit {int(summary.exit_code)}, status {summary.status}, schema "
            f"{summary.schema_version}, {summary.handler_count} handler(s) in "
            f"{summary.dag_count} Dag(s), {summary.timings.total_ms:.0f} ms",
            4,
        )
        say(
            f"result line after the marker: {summary.result_bytes} bytes, sha256 "
            f"{(summary.result_sha256 or '')[:16]}… matches the termination message: accepted",
            4,
        )
        for dag_id, declarations in sorted(accepted.result.task_handlers.items()):
            for declaration in declarations:
                say(
                    f"handler {dag_id}.{declaration.task_id}: {describe_declaration(declaration)}",
                    4,
                )

    # -- step 3

    def start_database(self) -> None:
        venv = ensure_airflow_venv(report=lambda line: say(line, 2))
        self.server = PostgresServer()
        self.server.start()
        say(f"PostgreSQL on 127.0.0.1:{self.server.port} ({self.server.workdir})")
        self.server.create_database(DATABASE)
        url = self.server.url(DATABASE)
        airflow = AirflowCli(venv)
        started = time.monotonic()
        airflow(url, "db", "migrate", timeout=AIRFLOW_MIGRATE_TIMEOUT)
        say(
            f"airflow db migrate (apache-airflow-core {AIRFLOW_VERSION}, side venv): "
            f"{time.monotonic() - started:.1f} s"
        )
        self.run_cli("db", "upgrade", "--url", url)
        self.database = Database(url, create_engine(url), create_sync_engine(url))
        self.store = DatabaseStore(self.database.engine)

        dags = self.root / "dags"
        dags.mkdir()
        (dags / DAG_FILE).write_text(DAG_SOURCE, encoding="utf-8")
        started = time.monotonic()
        reserialize_dags(airflow, dags, url)
        say(
            f"airflow dags reserialize wrote Dag {DAG_ID!r} from {DAG_FILE}: "
            f"{time.monotonic() - started:.1f} s"
        )
        with self.db.sync_engine.begin() as conn:
            for task_id, arguments in STUB_ARGUMENTS.items():
                add_stub_fields(conn, DAG_ID, task_id, arg_bindings=arguments)
        say(f"Added is_stub and _arg_bindings to {', '.join(STUB_ARGUMENTS)} in Airflow's row")

    def refresh_inventory(self) -> None:
        delta = self.run(self.db_store.inventory.refresh(self.db.engine))
        say(
            f"StubInventory.refresh: {len(delta.changed)} Dag(s) read, {delta.unchanged} "
            f"unchanged, {len(delta.removed)} removed"
        )

    def show_inventory(self) -> None:
        rows = [
            (dag.dag_id, stub.task_id, stub.queue, describe_arguments(stub))
            for dag in self.db_store.inventory.dags.values()
            for stub in dag.stubs
        ]
        table(("DAG", "STUB", "QUEUE", "ARGUMENTS"), rows)

    def write(self, run: BundleRun) -> tuple[DagVerdict, PassResult]:
        """The validate and write steps of one bundle's pass (one transaction)."""
        validated = self.run(steps.validate(self.db_store, run.spec, run.planned, run.probed))
        written = self.run(steps.write(self.db_store, run.spec, run.probed, validated))
        verdict = next(v for v in validated.result.verdicts if v.dag_id == DAG_ID)
        return verdict, written

    def write_all(self, passes: Sequence[BundleRun]) -> list[tuple[DagVerdict, PassResult]]:
        """Write each bundle's pass and show what it did; returns each verdict and result."""
        rows = []
        outcomes = []
        for run in passes:
            verdict, written = self.write(run)
            outcomes.append((verdict, written))
            if verdict.bindings is None:
                outcome = f"{len(verdict.errors)} error(s): rows kept"
            else:
                outcome = f"{len(verdict.bindings)} stub(s) bound"
            rows.append(
                (
                    run.bundle.name,
                    run.bundle.queue,
                    outcome,
                    f"{written.artifacts_inserted}/{written.artifacts_updated}",
                    f"{written.bindings_inserted}/{written.bindings_updated}"
                    f"/{written.bindings_deleted}",
                    f"{written.problems_inserted}/{written.problems_deleted}",
                    str(written.rows_written),
                    str(written.statements),
                )
            )
            for line in (verdict.report() or "").splitlines():
                say(line, 4)
        headers = ("BUNDLE", "QUEUE", f"DAG {DAG_ID}", "ARTIFACTS +/~", "BINDINGS +/~/-")
        table((*headers, "PROBLEMS +/-", "ROWS WRITTEN", "STATEMENTS"), rows)
        say("(+ inserted, ~ updated, - deleted)", 4)
        return outcomes

    def binding_rows(self) -> list[tuple[str, ...]]:
        b, a = binding_table, artifact_table
        query = (
            select(
                b.c.dag_id,
                b.c.task_id,
                a.c.bundle_name,
                a.c.relative_fileloc,
                b.c.dag_relative_fileloc,
                # The row version: equal before and after means the row was not rewritten.
                literal_column(f"{b.name}.xmin::text").label("xmin"),
            )
            .join(a, a.c.id == b.c.artifact_id)
            .order_by(b.c.dag_id, b.c.task_id)
        )
        with self.db.sync_engine.connect() as conn:
            return [tuple(str(v) for v in row) for row in conn.execute(query).all()]

    def show_bindings(self, rows: Sequence[tuple[str, ...]]) -> None:
        say("Binding rows (lang_sdk_task_handler joined to lang_sdk_task_handler_artifact):")
        table(("DAG_ID", "TASK_ID", "ARTIFACT BUNDLE", "ARTIFACT", "DAG FILE", "XMIN"), rows)

    # -- step 4

    def scheduler(self) -> None:
        dags = self.db_store.inventory.dags.values()
        stubs = {(d.dag_id, s.task_id) for d in dags for s in d.stubs}
        payloads = [execute_task(task_id, queue) for task_id, queue in WORKLOAD_TASKS]
        with self.db.sync_engine.connect() as conn:
            refs = resolve_task_handlers_sync(conn, stubs)
            result = attach_task_handlers(payloads, refs, stub_keys=stubs)
            reasons = explain_unbound_sync(conn, result.unbound)
        say(
            f"resolve_task_handlers_sync: {len(stubs)} stub pair(s) -> {len(refs)} "
            "reference(s), one statement; attach_task_handlers on four ExecuteTask payloads:"
        )
        rows = [
            (
                w["ti"]["task_id"],
                w["ti"]["queue"],
                "stub" if (DAG_ID, w["ti"]["task_id"]) in stubs else "python",
                compact(w["task_handler_artifact"]),
            )
            for w in result.workloads
        ]
        table(("TASK", "QUEUE", "KIND", "task_handler_artifact"), rows)
        say("The first payload, one key a line:")
        for key, value in result.workloads[0].items():
            say(f"{key}: {compact(value)}", 4)
        for (dag_id, task_id), reason in reasons.items():
            say(f"unbound {dag_id}.{task_id}: {reason}", 4)
        say(f"Stubs without a binding: {len(result.unbound)}")
        if len(refs) != len(stubs) or result.unbound:
            raise Unexpected(f"{len(result.unbound)} stub(s) have no binding")

    def resolve_one(self, task_id: str) -> str:
        with self.db.sync_engine.connect() as conn:
            ref = resolve_task_handlers_sync(conn, [(DAG_ID, task_id)]).get((DAG_ID, task_id))
        if ref is None or ref.bundle_info is None:
            return "no binding"
        return f"{ref.bundle_info.name}:{ref.rel_path}"

    # -- step 6

    def problems(self, bundle: ExampleBundle) -> list[str]:
        p = problem_table
        query = (
            select(p.c.severity, p.c.kind, p.c.message)
            .where(p.c.bundle_name == bundle.name)
            .order_by(p.c.message)
        )
        with self.db.sync_engine.connect() as conn:
            return [f"{r.severity} ({r.kind}): {r.message}" for r in conn.execute(query).all()]

    # -- step 7

    def close(self) -> None:
        """Stop and remove everything this run started; safe to call more than once."""
        try:
            if self.database is not None:
                database, self.database = self.database, None
                with contextlib.suppress(Exception):
                    self.runner.run(database.engine.dispose())
                database.sync_engine.dispose()
            self.runner.close()
        finally:
            try:
                if self.server is not None:
                    server, self.server = self.server, None
                    server.stop()
            finally:
                shutil.rmtree(self.root, ignore_errors=True)


def check_plan_agrees(output: str, plan: ProbePlan[Any]) -> None:
    match = re.search(r"^(\d+) cached, (\d+) to probe, (\d+) rejected", output, re.M)
    wanted = (len(plan.cached), len(plan.probe), len(plan.rejected))
    if match is None or tuple(int(n) for n in match.groups()) != wanted:
        raise Unexpected(f"`plan` and the in-process planner disagree (planner: {wanted})")


# --- the steps ------------------------------------------------------------------------------


def run_demo(demo: Demo) -> None:
    with demo.step("1. Build the three test runtimes and lay out one bundle per language"):
        demo.build_bundles()

    with demo.step("2. inspect, plan (nothing known yet) and probe each bundle with the CLI"):
        first = [demo.probe_pass(b, inspect=True) for b in BUNDLES]
        if any(p.planned.plan.cached or len(p.planned.plan.probe) != 1 for p in first):
            raise Unexpected("with no known artifacts every artifact must be probed")

    with demo.step("3. PostgreSQL with Airflow's schema: inventory, validation, write pass"):
        demo.start_database()
        demo.refresh_inventory()
        demo.show_inventory()
        say("Validation and write pass per bundle (one transaction each):")
        if any(verdict.errors for verdict, _written in demo.write_all(first)):
            raise Unexpected("the first pass found problems")
        bindings = demo.binding_rows()
        demo.show_bindings(bindings)
        bound = sorted(row[1] for row in bindings)
        if bound != ["extract", "publish", "transform"]:
            raise Unexpected(f"expected bindings for extract, transform, publish; got {bound}")

    with demo.step("4. Scheduler read path: ExecuteTask payloads with task_handler_artifact"):
        demo.scheduler()

    with demo.step("5. Second pass, nothing changed: every artifact cached, nothing written"):
        demo.refresh_inventory()
        second = [demo.probe_pass(b) for b in BUNDLES]
        if any(p.planned.plan.probe or len(p.planned.plan.cached) != 1 for p in second):
            raise Unexpected("an unchanged bundle must reuse its stored answer")
        say("Validation and write pass per bundle:")
        total = sum(written.rows_written for _verdict, written in demo.write_all(second))
        after = demo.binding_rows()
        unchanged = "yes" if after == bindings else "NO"
        say(f"Second pass: {total} row(s) written; binding row versions unchanged: {unchanged}")
        if total != 0 or after != bindings:
            raise Unexpected("the second pass rewrote rows")

    with demo.step("6. A new build drops the handler of 'publish': the Dag keeps its rows"):
        typescript = BUNDLES[2]
        rebuilt = build_runtime(typescript.language.value, RENAMED_HANDLERS)
        demo.install_artifact(typescript, rebuilt)
        say(
            f"Replaced {typescript.name}/{typescript.rel_path} with a build that declares "
            f"{DAG_ID}.publish_report instead of {DAG_ID}.publish"
        )
        demo.refresh_inventory()
        changed = demo.probe_pass(typescript)
        if len(changed.planned.plan.probe) != 1:
            raise Unexpected("the changed artifact must be probed again")
        say("Validation and write pass:")
        [(verdict, _written)] = demo.write_all([changed])
        say("Problems stored for the bundle (thop_bundle_problem):")
        stored = demo.problems(typescript)
        for line in stored:
            say(line, 4)
        after = demo.binding_rows()
        demo.show_bindings(after)
        kept = "yes" if after == bindings else "NO"
        say(f"Old binding rows kept: {kept} ({len(after)} row(s), same row versions)")
        say(f"The scheduler still resolves {DAG_ID}.publish to {demo.resolve_one('publish')}")
        unbound = [p for p in verdict.errors if p.kind == "unbound" and p.task_id == "publish"]
        if (
            verdict.bindings is not None
            or not unbound
            or len(stored) != len(verdict.errors) + len(verdict.warnings)
        ):
            raise Unexpected("the Dag was not held back by an 'unbound' problem for 'publish'")
        if after != bindings:
            raise Unexpected("the bad artifact changed the binding rows")


def main() -> int:
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="thop-demo-"))
    demo = Demo(root)
    say("taskhandler-operator demo: three Lang-SDK bundles, Airflow's real schema, no mocks")
    say(f"work folder $DEMO = {root}")
    failure: StepFailed | None = None
    interrupted = False
    try:
        run_demo(demo)
    except StepFailed as exc:
        failure = exc
    except KeyboardInterrupt:
        interrupted = True
    finally:
        cleanup = time.monotonic()
        try:
            demo.close()
        finally:
            outcome = "ok" if not root.exists() else "failed"
            demo.timings.append(
                ("7. Stop PostgreSQL, remove $DEMO", time.monotonic() - cleanup, outcome)
            )
    say()
    say("=== Summary " + "=" * 84)
    rows = [(title, f"{seconds:.1f} s", outcome) for title, seconds, outcome in demo.timings]
    table(("STEP", "TIME", "OUTCOME"), rows)
    removed = "yes" if not root.exists() else "NO"
    say(f"total {time.monotonic() - started:.1f} s; $DEMO removed: {removed}")
    if interrupted:
        step = next((t for t, _s, o in demo.timings if o == "interrupted"), "between steps")
        say(f"demo INTERRUPTED during step {step}")
        return 130
    if failure is not None:
        say(f"demo FAILED in step {failure.step}")
        print(f"  {failure.message}", flush=True)  # in full: it is what the reader acts on
        return 1
    say(
        "demo OK: 3 stubs bound across Go, Java and TypeScript; the second pass wrote 0 rows; "
        "the bad build lost no binding"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
