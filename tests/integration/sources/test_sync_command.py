"""``taskhandler-operator sync``: try a source without a cluster."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from taskhandler_devenv.packers import write_typescript_bundle
from taskhandler_operator.cli import main
from tests.fixtures.sources import PLANTED_TOKEN, HttpServer

pytestmark = pytest.mark.integration


def bundle_yaml(path: Path, source: dict[str, object], language: str = "typescript") -> Path:
    document = {
        "apiVersion": "langsdk.dev/v1alpha1",
        "kind": "TaskHandlerBundle",
        "metadata": {"name": "ts-handlers", "namespace": "team-a"},
        "spec": {
            "bundleName": "ts-handlers",
            "language": language,
            "queues": ["typescript"],
            "source": source,
        },
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    folder = tmp_path / "pvc"
    write_typescript_bundle(folder / "handlers" / "etl.min.mjs", code=b"export const a = 1;\n")
    (folder / "README.md").write_text("not an artifact")
    return folder


def test_sync_a_bundle_and_list_its_candidates(
    volume: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = bundle_yaml(tmp_path / "bundle.yaml", {"volume": {"path": str(volume)}})
    store = tmp_path / "store"
    assert main(["sync", str(spec), "--store", str(store), "--list"]) == 0
    out = capsys.readouterr().out
    fields = dict(line.split(None, 1) for line in out.splitlines()[:7])
    assert fields["kind"] == "volume" and fields["files"] == "2"
    revision = store / "team-a" / "ts-handlers" / fields["revision"]
    assert fields["path"] == str(revision) and revision.is_dir()
    assert "handlers/etl.min.mjs" in out and "1 candidate(s) (typescript)" in out


def test_json_output_and_a_bare_source_file(
    volume: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "My Source.yaml"
    source.write_text(yaml.safe_dump({"volume": {"path": str(volume)}}))
    code = main(
        ["sync", str(source), "--store", str(tmp_path / "s"), "--json", "--list", "--language",
         "typescript"]
    )  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["namespace"], document["bundle"]) == ("default", "my-source")
    assert [c["rel_path"] for c in document["candidates"]] == ["handlers/etl.min.mjs"]


def test_a_secret_manifest_supplies_the_credentials(
    source_http: HttpServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = b"protected artifact"
    url = source_http.put_file(f"{secrets.token_hex(4)}/artifact.min.mjs", data)
    spec = bundle_yaml(
        tmp_path / "bundle.yaml",
        {
            "http": {
                "url": url,
                "sha256": hashlib.sha256(data).hexdigest(),
                "secretRef": {"name": "artifact-token"},
            }
        },
    )
    secret = tmp_path / "secret.yaml"
    secret.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "artifact-token"},
                "data": {"token": base64.b64encode(PLANTED_TOKEN.encode()).decode()},
            }
        )
    )
    store = tmp_path / "store"
    assert main(["sync", str(spec), "--store", str(store), "--secret-file", str(secret)]) == 0
    captured = capsys.readouterr()
    assert "files     1" in captured.out
    assert PLANTED_TOKEN not in captured.out + captured.err


@pytest.mark.parametrize(
    ("source", "extra", "code", "text"),
    [
        (
            {"git": {"url": "https://h/r.git"}, "volume": {"path": "/x"}},
            [],
            2,
            "exactly one of git, http, s3, volume",
        ),
        (
            {"http": {"url": "https://h/a.tgz", "sha256": "0" * 64, "secretRef": {"name": "s"}}},
            [],
            2,
            "names Secret 's'; pass its data with --secret-file",
        ),
        ({"volume": {"path": "/nonexistent/thop"}}, [], 1, "sync: NotFound: volume folder"),
        ({"volume": {"path": "/tmp"}}, ["--namespace", "Not_A_Name"], 2, "not a valid"),
    ],
)
def test_failures_are_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    source: dict[str, object],
    extra: list[str],
    code: int,
    text: str,
) -> None:
    spec = bundle_yaml(tmp_path / "bundle.yaml", source)
    assert main(["sync", str(spec), "--store", str(tmp_path / "store"), *extra]) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_list_needs_a_language(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "source.yaml"
    source.write_text(yaml.safe_dump({"volume": {"path": str(tmp_path)}}))
    assert main(["sync", str(source), "--store", str(tmp_path / "s"), "--list"]) == 2
    assert "--list needs --language" in capsys.readouterr().err


def test_the_installed_command(volume: Path, tmp_path: Path) -> None:
    spec = bundle_yaml(tmp_path / "bundle.yaml", {"volume": {"path": str(volume)}})
    proc = subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", "sync", str(spec), "--store",
         str(tmp_path / "store")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("revision ")
