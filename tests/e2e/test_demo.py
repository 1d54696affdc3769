"""``make demo`` end to end: ``hack/demo.py`` run as a subprocess, its key facts asserted.

The demo uses real parts only (toolchains, the CLI, PostgreSQL with Airflow's schema), so these
tests assert what it prints on stable lines: table rows, counts and problem texts, never timings
or temporary paths.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = REPO_ROOT / "hack" / "demo.py"
TOOLCHAINS = ("go", "javac", "java", "node")
# The first run may build the Airflow side venv and the three runtimes.
DEMO_TIMEOUT = 900.0

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(DEMO_TIMEOUT + 60)]

BINDINGS = (
    ("extract", "orders-go", "extract"),
    ("publish", "orders-typescript", "publish.min.mjs"),
    ("transform", "orders-java", "orders-transform.jar"),
)
UNBOUND_PUBLISH = (
    "Dag 'orders_etl', task 'publish': no artifact in Dag bundle 'orders-typescript' registers it"
)


def _require_toolchains() -> None:
    missing = [tool for tool in TOOLCHAINS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH; the demo builds runtimes with them")


def run_demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    _require_toolchains()
    return subprocess.run(
        [sys.executable, str(DEMO)],
        cwd=REPO_ROOT,
        # TMPDIR: the demo's work folder lands in tmp_path, so a leftover would be seen.
        env={**os.environ, "TMPDIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def sections(output: str) -> dict[str, str]:
    """The output split at its ``=== <step> ===`` headings, keyed by the step number ("1".."7")."""
    found: dict[str, str] = {}
    key = "start"
    for line in output.splitlines():
        heading = re.match(r"^=== (\d+|Summary)\b", line)
        if heading:
            key = heading.group(1)
        found[key] = found.get(key, "") + line + "\n"
    return found


def binding_rows(section: str) -> list[str]:
    pattern = r"^\s+orders_etl\s+(extract|publish|transform)\s+\S+\s+\S+\s+orders_etl\.py\s+\d+$"
    return [m.group(0) for m in re.finditer(pattern, section, re.M)]


def work_folder(output: str) -> Path:
    match = re.search(r"^work folder \$DEMO = (\S+)$", output, re.M)
    assert match is not None, output[:500]
    return Path(match.group(1))


def test_demo_binds_caches_and_keeps_rows(tmp_path: Path) -> None:
    proc = run_demo(tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    step = sections(out)

    # 2: one probe per bundle, each result accepted against its termination message.
    assert step["2"].count("exit 0, status ok, schema 2026-10-30, 1 handler(s) in 1 Dag(s)") == 3
    assert step["2"].count("matches the termination message: accepted") == 3
    assert step["2"].count("0 cached, 1 to probe, 0 rejected") == 3
    assert "handler orders_etl.extract: positional(#0: string, #1: string|null)" in step["2"]

    # 3: the stub inventory read from Airflow's row, then one binding per stub.
    assert "StubInventory.refresh: 1 Dag(s) read, 0 unchanged, 0 removed" in step["3"]
    assert step["3"].count("1 stub(s) bound") == 3
    first_rows = binding_rows(step["3"])
    assert len(first_rows) == 3
    for (task_id, bundle, artifact), row in zip(BINDINGS, first_rows, strict=True):
        assert row.split()[:4] == ["orders_etl", task_id, bundle, artifact]

    # 4: the ExecuteTask payloads carry the artifact; the ordinary task gets null.
    for task_id, bundle, artifact in BINDINGS:
        ref = f'{{"bundle_info":{{"name":"{bundle}","version":null}},"rel_path":"{artifact}"}}'
        assert re.search(rf"^\s+{task_id}\s+\S+\s+stub\s+{re.escape(ref)}$", step["4"], re.M)
    assert re.search(r"^\s+notify\s+default\s+python\s+null$", step["4"], re.M)
    assert "Stubs without a binding: 0" in step["4"]

    # 5: nothing changed, so every artifact is cached and no row is written.
    for _task_id, _bundle, artifact in BINDINGS:
        assert re.search(
            rf"^\s+cached\s+{re.escape(artifact)}\s+\d+\s+1 handler\(s\)$", step["5"], re.M
        )
    assert step["5"].count("1 cached, 0 to probe, 0 rejected") == 3
    assert "Second pass: 0 row(s) written; binding row versions unchanged: yes" in step["5"]

    # 6: the rebuilt bundle no longer declares `publish`: a readable problem, the rows stay.
    assert "handler orders_etl.publish_report: named(summary: object, channel: string)" in step["6"]
    assert f"- {UNBOUND_PUBLISH}" in step["6"]
    assert f"error (unbound): {UNBOUND_PUBLISH}" in step["6"]
    assert "1 error(s): rows kept" in step["6"]
    assert binding_rows(step["6"]) == first_rows  # same rows, same xmin
    assert "Old binding rows kept: yes (3 row(s), same row versions)" in step["6"]
    assert "resolves orders_etl.publish to orders-typescript:publish.min.mjs" in step["6"]

    # 7: everything stopped and removed.
    assert out.rstrip().splitlines()[-1].startswith("demo OK: 3 stubs bound")
    assert not work_folder(out).exists()
    assert list(tmp_path.glob("thop-demo-*")) == []


def test_a_failing_step_is_named_and_everything_is_removed(tmp_path: Path) -> None:
    no_postgres = tmp_path / "no-postgres"
    proc = run_demo(tmp_path, THOP_PG_BIN=str(no_postgres))
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    lines = out.splitlines()
    assert (
        "demo FAILED in step 3. PostgreSQL with Airflow's schema: inventory, validation, "
        "write pass" in lines
    )
    assert (
        "  PostgresBinariesMissing: PostgreSQL server binaries not found: "
        f"THOP_PG_BIN={no_postgres} lacks initdb, pg_ctl, postgres; install them with "
        "`apt-get install postgresql` or point THOP_PG_BIN at their bin dir"
    ) in lines
    assert re.search(r"^\s+3\. PostgreSQL .*\s+failed$", out, re.M)
    assert not work_folder(out).exists()
    assert list(tmp_path.glob("thop-demo-*")) == []
