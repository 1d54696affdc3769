"""The inspect, plan and verify subcommands, run through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskhandler_devenv.packers import write_go_bundle, write_jar, write_typescript_bundle
from taskhandler_operator.cli import main
from tests.unit.artifacts.helpers import flip

BINARY = b"\x7fELF" + b"\x01" * 100
DIGEST = "a" * 64


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_go_bundle(root / "bin" / "etl", BINARY, cache_digest=DIGEST)
    write_go_bundle(root / "bin" / "load", BINARY, cache_digest="b" * 64).chmod(0o644)
    write_go_bundle(root / "bin" / "report", BINARY, cache_digest=None)
    write_go_bundle(root / "bin" / "new", BINARY, cache_digest="c" * 64)
    write_jar(
        root / "lib" / "handlers.jar",
        manifest={
            "Main-Class": "x.Main",
            "Airflow-Cache-Digest": "e" * 64,
            "Airflow-Supervisor-Schema-Version": "2026-10-30",
        },
    )
    write_typescript_bundle(root / "ui" / "bundle.min.mjs", b"export{}")
    (root / "escape").symlink_to(tmp_path)
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_prints_a_table(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "inspect", str(bundle), "--language", "go")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["PATH", "SIZE", "DIGEST", "VERDICT"]
    assert lines[1].split()[0] == "bin/etl"
    assert lines[1].split()[2:] == [DIGEST, "candidate"]
    assert "error: bin/load is not executable." in lines[2]
    assert lines[3].split()[0] == "bin/new"
    assert lines[4].split()[2] == "-"  # no stored digest
    assert f"problem: escape: symlink points outside the bundle root ({bundle.parent})" in out
    assert lines[-1].startswith("4 candidate(s), 6 file(s) walked, ")


def test_inspect_json(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "inspect", str(bundle), "--language", "java", "--json")
    assert code == 0
    document = json.loads(out)
    assert document["candidates"] == [
        {
            "rel_path": "lib/handlers.jar",
            "size_bytes": (bundle / "lib" / "handlers.jar").stat().st_size,
            "cache_digest": "e" * 64,
            "error": None,
        }
    ]
    assert document["problems"][0]["rel_path"] == "escape"


def test_inspect_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "inspect", str(tmp_path / "nope"), "--language", "go")
    assert code == 2
    assert err == f"inspect: {tmp_path / 'nope'} cannot be resolved: No such file or directory\n"


def _known_file(tmp_path: Path, bundle: Path) -> Path:
    etl_size = (bundle / "bin" / "etl").stat().st_size
    known = [
        {
            "bundle_name": "go-handlers",
            "relative_fileloc": "bin/etl",
            "size_bytes": etl_size,
            "cache_digest": DIGEST,
            "task_handlers": {"dag": [{"task_id": "t", "binding": "positional", "params": None}]},
        },
        {
            "bundle_name": "go-handlers",
            "relative_fileloc": "bin/load",
            "size_bytes": etl_size,
            "cache_digest": "b" * 64,
            "task_handlers": {},
        },
    ]
    path = tmp_path / "known.json"
    path.write_text(json.dumps(known))
    return path


def test_plan_table(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    known = _known_file(tmp_path, bundle)
    code, out, _ = _run(
        capsys, "plan", str(bundle), "--bundle-name", "go-handlers", "--known", str(known)
    )
    assert code == 0
    rows = [line.split()[:2] for line in out.splitlines()[1:-1]]
    assert rows == [
        ["cached", "bin/etl"],
        ["probe", "bin/new"],
        ["probe", "bin/report"],
        ["probe", "lib/handlers.jar"],
        ["probe", "ui/bundle.min.mjs"],
        ["rejected", "bin/load"],
    ]
    assert "no stored digest" in out.splitlines()[3]
    assert out.splitlines()[-1] == (
        "1 cached, 4 to probe, 1 rejected (bundle 'go-handlers', 2 known artifact(s))"
    )


def test_plan_json_for_one_language(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known = _known_file(tmp_path, bundle)
    code, out, _ = _run(
        capsys,
        "plan",
        str(bundle),
        "--bundle-name",
        "other-bundle",
        "--known",
        str(known),
        "--language",
        "go",
        "--json",
    )
    assert code == 0
    document = json.loads(out)
    assert document["cached"] == []  # the records belong to another bundle
    assert [c["rel_path"] for c in document["probe"]] == ["bin/etl", "bin/new", "bin/report"]
    assert [c["rel_path"] for c in document["rejected"]] == ["bin/load"]


def test_plan_rejects_a_malformed_known_file(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"bundle_name": "B", "relative_fileloc": "x", "size_bytes": -1}]))
    code, _, err = _run(capsys, "plan", str(bundle), "--bundle-name", "B", "--known", str(bad))
    assert code == 2
    assert err == (
        f"plan: --known {bad} is not a list of known artifacts: 0.size_bytes: Input should be "
        "greater than or equal to 0\n"
    )


def test_plan_missing_known_file(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        capsys, "plan", str(bundle), "--bundle-name", "B", "--known", str(tmp_path / "x.json")
    )
    assert code == 2
    assert err == (
        f"plan: --known {tmp_path / 'x.json'}: cannot be opened (No such file or directory)\n"
    )


def test_verify_prints_the_schema_version(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "verify", str(bundle / "bin" / "etl"))
    assert (code, out) == (0, "2026-10-30\n")
    code, out, _ = _run(capsys, "verify", str(bundle / "ui" / "bundle.min.mjs"))
    assert (code, out) == (0, "2026-10-30\n")


def test_verify_json_for_java(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "verify",
        str(bundle / "lib" / "handlers.jar"),
        "--bundle-root",
        str(bundle),
        "--json",
    )
    assert code == 0
    document = json.loads(out)
    assert document["main_class"] == "x.Main"
    assert document["language"] == "java"
    assert document["classpath"] == [str(bundle / "lib" / "handlers.jar")]


def test_verify_prints_the_reason_it_fails(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flip(bundle / "bin" / "etl", 3)
    code, out, err = _run(
        capsys, "verify", str(bundle / "bin" / "etl"), "--bundle-root", str(bundle)
    )
    assert code == 1
    assert out == ""
    assert err.startswith(
        "verify: FAILED: bin/etl: binary region SHA-256 does not match the trailer"
    )


def test_verify_with_explicit_language(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "verify", str(bundle / "lib" / "handlers.jar"), "--language", "go", "--json"
    )
    assert code == 1
    assert json.loads(out)["error"].endswith(
        "handlers.jar: not a Go executable bundle (no AFBNDL01 trailer in the last 64 bytes)"
    )


def test_console_script_runs_inspect(bundle: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "taskhandler_operator",
            "inspect",
            str(bundle),
            "--language",
            "typescript",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ui/bundle.min.mjs" in proc.stdout
