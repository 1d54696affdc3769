"""Every file the CLI reads is bounded (issue 25, items 6 and 7): the real command, as a
subprocess with a timeout, for each hostile input; each exits 2 with one line naming the
problem, never a traceback, a hang or a MemoryError."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SHA = "0" * 64
LEVELS = "abcdefghi"


def alias_bomb(tail: str) -> str:
    """Nine levels of nine aliases each: 9**9 strings once expanded; ``tail`` uses ``*i``."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, level in itertools.pairwise(LEVELS):
        lines.append(f"{level}: &{level} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n" + tail


def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        check=False,
    )


def assert_usage_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    err = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1, err[-2000:]
    for word in words:
        assert word in err, err


@pytest.fixture
def volume_bundle(tmp_path: Path) -> Path:
    path = tmp_path / "bundle.yaml"
    path.write_text(
        "kind: TaskHandlerBundle\nmetadata: {name: b, namespace: ns}\n"
        f"spec: {{language: go, source: {{volume: {{path: '{tmp_path}'}}}}}}\n"
    )
    return path


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return fifo


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "folder"
    folder.mkdir()
    return folder


def _latin1(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"kind: TaskHandlerBundle\nmetadata: {name: caf\xe9}\n")
    return path


def _bomb_name(tmp_path: Path) -> Path:
    path = tmp_path / "bomb-name.yaml"
    path.write_text(
        alias_bomb("kind: TaskHandlerBundle\nmetadata: {name: *i}\n")
        + f"spec: {{source: {{volume: {{path: '{tmp_path}'}}}}}}\n"
    )
    return path


def _bomb_namespace(tmp_path: Path) -> Path:
    path = tmp_path / "bomb-ns.yaml"
    path.write_text(
        alias_bomb("kind: TaskHandlerBundle\nmetadata: {name: b, namespace: *i}\n")
        + f"spec: {{source: {{volume: {{path: '{tmp_path}'}}}}}}\n"
    )
    return path


def _deep_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "deep.yaml"
    path.write_text("source: " + "[" * 100_000 + "]" * 100_000 + "\n")
    return path


BUNDLE_FILES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "dev-zero": (lambda _tmp: Path("/dev/zero"), ("/dev/zero: is not a regular file",)),
    "fifo": (_fifo, ("is not a regular file",)),
    "folder": (_folder, ("is a folder, not a file",)),
    "non-utf8": (_latin1, ("is not UTF-8 text", "0xe9")),
    "alias-bomb-name": (_bomb_name, ("YAML aliases",)),
    "alias-bomb-namespace": (_bomb_namespace, ("YAML aliases",)),
    "deep": (_deep_yaml, ("nested more than",)),
}


@pytest.mark.parametrize("case", list(BUNDLE_FILES))
def test_sync_refuses_a_hostile_bundle_file(tmp_path: Path, case: str) -> None:
    make, words = BUNDLE_FILES[case]
    done = run("sync", str(make(tmp_path)), "--store", str(tmp_path / "store"))
    assert_usage_error(done, *words)


def _secret(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "secret.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


SECRET_FILES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "dev-zero": (lambda _tmp: Path("/dev/zero"), ("is not a regular file",)),
    "fifo": (_fifo, ("is not a regular file",)),
    "folder": (_folder, ("is a folder",)),
    "non-utf8": (lambda t: _secret(t, b"token: \xff\xfe\n"), ("is not UTF-8 text",)),
    "alias-bomb-value": (lambda t: _secret(t, alias_bomb("token: *i\n")), ("YAML aliases",)),
    "data-not-a-mapping": (
        lambda t: _secret(t, "kind: Secret\ndata: [a, b]\n"),
        ("data must be a mapping",),
    ),
    "stringData-not-a-mapping": (
        lambda t: _secret(t, "kind: Secret\nstringData: just text\n"),
        ("stringData must be a mapping",),
    ),
    "stringData-value-a-list": (
        lambda t: _secret(t, "kind: Secret\nstringData: {token: [a, b]}\n"),
        ("stringData.token must be a string",),
    ),
    "value-a-mapping": (lambda t: _secret(t, "token: {a: b}\n"), ("token must be a string",)),
}


@pytest.mark.parametrize("case", list(SECRET_FILES))
def test_sync_refuses_a_hostile_secret_file(tmp_path: Path, volume_bundle: Path, case: str) -> None:
    make, words = SECRET_FILES[case]
    secret = make(tmp_path)
    done = run(
        "sync", str(volume_bundle), "--store", str(tmp_path / "s"), "--secret-file", str(secret)
    )
    assert_usage_error(done, *words)


@pytest.mark.parametrize("flag", ["--namespace", "--bundle"])
def test_sync_refuses_a_name_with_a_final_newline(
    tmp_path: Path, volume_bundle: Path, flag: str
) -> None:
    done = run("sync", str(volume_bundle), "--store", str(tmp_path / "store"), flag, "ns\n")
    assert_usage_error(done, "is not a valid Kubernetes object name")
    assert not (tmp_path / "store").exists() or not any(
        "\n" in p.name for p in (tmp_path / "store").rglob("*")
    )


def _manifest(tmp_path: Path, data: str | bytes) -> Path:
    path = tmp_path / "manifest.json"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


MANIFESTS: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "dev-zero": (lambda _tmp: Path("/dev/zero"), ("is not a regular file",)),
    "fifo": (_fifo, ("is not a regular file",)),
    "folder": (_folder, ("is a folder",)),
    "non-utf8": (lambda t: _manifest(t, b'[{"path": "\xff"}]'), ("is not UTF-8 text",)),
    "deep": (lambda t: _manifest(t, "[" * 100_000 + "]" * 100_000), ("nested more than",)),
    "bad-ipv6-url": (
        lambda t: _manifest(
            t, json.dumps([{"path": "a", "url": "http://[::1/x", "sha256": SHA, "size": 1}])
        ),
        ("is not a valid URL",),
    ),
    "bad-port": (
        lambda t: _manifest(
            t, json.dumps([{"path": "a", "url": "http://h:99999/x", "sha256": SHA, "size": 1}])
        ),
        ("is not a valid URL",),
    ),
}


@pytest.mark.parametrize("case", list(MANIFESTS))
def test_fetch_refuses_a_hostile_manifest(tmp_path: Path, case: str) -> None:
    make, words = MANIFESTS[case]
    done = run("fetch", "--dest", str(tmp_path / "d"), "--manifest-file", str(make(tmp_path)))
    assert_usage_error(done, *words)


def test_fetch_refuses_a_bad_url_given_inline(tmp_path: Path) -> None:
    manifest = json.dumps([{"path": "a", "url": "http://[::1/x", "sha256": SHA, "size": 1}])
    done = run("fetch", "--dest", str(tmp_path / "d"), "--manifest", manifest)
    assert_usage_error(done, "is not a valid URL")


def test_fetch_refuses_deep_json_on_stdin(tmp_path: Path) -> None:
    done = run("fetch", "--dest", str(tmp_path / "d"), "--manifest-file", "-", stdin="[" * 100_000)
    assert_usage_error(done, "nested more than")


def test_plan_refuses_a_folder_as_known_artifacts(tmp_path: Path) -> None:
    done = run("plan", str(tmp_path), "--bundle-name", "b", "--known", str(tmp_path))
    assert_usage_error(done, f"--known {tmp_path}: is a folder, not a file")


@pytest.mark.parametrize("url", ["http://h:99999/x", "http://h:abc/x", "http://h:-1/x"])
def test_sync_refuses_an_http_url_with_an_invalid_port(tmp_path: Path, url: str) -> None:
    path = tmp_path / "source.yaml"
    path.write_text(json.dumps({"http": {"url": url, "sha256": SHA}}))
    done = run("sync", str(path), "--store", str(tmp_path / "store"))
    assert_usage_error(done, "port, if any, is a number from 1 to 65535")
