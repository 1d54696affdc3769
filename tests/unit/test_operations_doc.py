"""docs/operations.md stays true to the code.

* Its troubleshooting table lists every reason the operator can set on a TaskHandlerBundle (a
  condition's, an artifact's in ``status.artifacts``, an Event's), and nothing else. The reasons
  live in four places: ``kube/conditions.py`` (``Reason``, ``EventReason``),
  ``kube/probe_job.py`` (``ProbeFailure``), the ``SourceError`` subclasses of ``sources`` and
  ``db/dag_bundle.py`` (``SyncReason``). The controller and the reconcile pass must use those
  names, never a string literal of their own, or a new reason could bypass the table.
* Its alerts section describes every alert of the chart's PrometheusRule, and nothing else.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import taskhandler_operator.sources as sources_package
from taskhandler_operator.db.dag_bundle import SyncReason
from taskhandler_operator.kube.conditions import EventReason, Reason
from taskhandler_operator.kube.probe_job import ProbeFailure
from taskhandler_operator.sources.errors import SourceError

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "operations.md"
RULE = REPO / "charts" / "taskhandler-operator" / "templates" / "prometheusrule.yaml"
PACKAGE = REPO / "operator" / "taskhandler_operator"
CAMEL = re.compile(r"`([A-Z][A-Za-z0-9]+)`")


def _section(heading: str) -> str:
    """The page's text under ``heading`` up to the next heading of the same or a higher level."""
    page = PAGE.read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    start = page.index(f"\n{heading}\n") + len(heading) + 2
    pattern = rf"^#{{1,{len(level)}}} "  # a heading of the same level or higher
    ends = [m.start() for m in re.finditer(pattern, page[start:], re.M)]
    return page[start : start + ends[0]] if ends else page[start:]


def _first_cells(section: str) -> list[str]:
    """The first cell of each body row of the section's tables (header and rule skipped)."""
    cells: list[str] = []
    rows = [line for line in section.splitlines() if line.startswith("|")]
    for i, row in enumerate(rows):
        if i + 1 < len(rows) and set(rows[i + 1].replace("|", "").strip()) <= set("-: "):
            continue  # a header: the next row is the rule
        if set(row.replace("|", "").strip()) <= set("-: "):
            continue
        cells.append(row.split("|")[1])
    return cells


def _source_error_classes(cls: type[SourceError]) -> Iterator[type[SourceError]]:
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("taskhandler_operator."):  # not a test's subclass
            yield sub
            yield from _source_error_classes(sub)


def reasons_in_code() -> set[str]:
    for module in pkgutil.iter_modules(sources_package.__path__):
        importlib.import_module(f"{sources_package.__name__}.{module.name}")
    reasons: set[str] = {str(r) for r in (*Reason, *EventReason, *ProbeFailure)}
    reasons |= set(get_args(SyncReason))
    reasons |= {cls.reason for cls in _source_error_classes(SourceError)}
    return reasons


def reasons_in_table() -> list[str]:
    found: list[str] = []
    for cell in _first_cells(_section("### By reason")):
        names = CAMEL.findall(cell)
        assert names, f"a troubleshooting row names no reason in backquotes: {cell.strip()!r}"
        found.extend(names)
    return found


def test_the_troubleshooting_table_lists_every_reason_the_code_sets() -> None:
    missing = sorted(reasons_in_code() - set(reasons_in_table()))
    assert missing == [], f"docs/operations.md's 'By reason' table misses {missing}"


def test_the_troubleshooting_table_lists_no_reason_the_code_no_longer_sets() -> None:
    stale = sorted(set(reasons_in_table()) - reasons_in_code())
    assert stale == [], f"docs/operations.md lists reasons the code no longer sets: {stale}"


def test_each_reason_has_one_row() -> None:
    listed = reasons_in_table()
    twice = sorted({r for r in listed if listed.count(r) > 1})
    assert twice == [], f"reasons listed twice in docs/operations.md: {twice}"


# Calls that take a reason: the keyword ``reason=`` anywhere, and these callables' arguments.
_REASON_CALLS = {"Reasoned", "EventSpec", "_fail", "put", "set_condition", "SourceSyncFailed"}
# kubeapi.py's reasons are the apiserver's (``NotFound``, ``AlreadyExists``), not the bundle's.
_SKIPPED = {"controller/kubeapi.py"}


def _literal_reasons(source: str, where: str) -> Iterator[str]:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        values = [k.value for k in node.keywords if k.arg == "reason"]
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in _REASON_CALLS:
            values.extend(node.args)
        for value in values:
            for const in ast.walk(value):
                if (
                    isinstance(const, ast.Constant)
                    and isinstance(const.value, str)
                    and re.fullmatch(r"[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*", const.value)
                ):
                    yield f"{where}:{const.lineno}: {const.value!r}"


def test_the_controller_and_the_pass_name_reasons_only_through_the_enums() -> None:
    found = [
        hit
        for folder in ("controller", "reconcile")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        if (where := path.relative_to(PACKAGE).as_posix()) not in _SKIPPED
        for hit in _literal_reasons(path.read_text(encoding="utf-8"), where)
    ]
    assert found == [], (
        "reasons written as string literals (add them to kube/conditions.py's Reason or "
        f"EventReason, or kube/probe_job.py's ProbeFailure, and to docs/operations.md): {found}"
    )


def test_the_literal_scan_sees_a_literal_reason() -> None:
    source = (
        'x = Reasoned("MadeUp", "a message")\n'
        'y = f(reason="AlsoMadeUp" if c else Reason.SYNCED)\n'
        'z = f(reason=Reason.SYNCED, note="NotAReason")\n'
    )
    hits = list(_literal_reasons(source, "sample.py"))
    assert hits == ["sample.py:1: 'MadeUp'", "sample.py:2: 'AlsoMadeUp'"]


def alerts_in_rule() -> set[str]:
    return set(re.findall(r"^\s*- alert: (\w+)\s*$", RULE.read_text(encoding="utf-8"), re.M))


def alerts_in_page() -> set[str]:
    return {
        name
        for cell in _first_cells(_section("## Alerts worth wiring"))
        for name in CAMEL.findall(cell)
    }


def test_every_alert_of_the_prometheus_rule_is_described() -> None:
    rule = alerts_in_rule()
    assert len(rule) >= 5, "the PrometheusRule template could not be read"
    missing = sorted(rule - alerts_in_page())
    assert missing == [], f"docs/operations.md's alerts section misses {missing}"
    stale = sorted(alerts_in_page() - rule)
    assert stale == [], f"docs/operations.md describes alerts the chart does not have: {stale}"


def runbook_sections() -> set[str]:
    return set(re.findall(r"^#### (\w+)$", _section("### By alert"), re.M))


def test_every_alert_has_a_runbook_section_and_points_at_it() -> None:
    """Each alert's ``runbook_url`` is ``prometheusRule.runbookBaseUrl#<alert in lower case>``,
    GitHub's anchor of a ``#### <Alert>`` section under "By alert" (the render test checks the
    rendered URLs)."""
    text = RULE.read_text(encoding="utf-8")
    blocks = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    pointed = {
        block.split()[0]: re.findall(r'"thop\.runbookUrl" \(list \$r "(\w+)"\)', block)
        for block in blocks
    }
    assert len(pointed) >= 5, "the PrometheusRule template could not be read"
    wrong = {alert: urls for alert, urls in pointed.items() if urls != [alert]}
    assert wrong == {}, f"alerts without their own runbook_url: {wrong}"
    missing = sorted(set(pointed) - runbook_sections())
    assert missing == [], f"docs/operations.md's 'By alert' section misses {missing}"
    stale = sorted(runbook_sections() - set(pointed))
    assert stale == [], f"docs/operations.md has runbooks of alerts the chart lacks: {stale}"
