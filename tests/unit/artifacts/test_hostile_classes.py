"""The hostile inputs of issue 10, one class at a time, each file generated here.

Every case answered wrongly before the fix it names: a traceback, minutes of work, a forged
row, a silent miss, or an answer where Airflow's worker refuses. Each must now be a candidate,
a problem or a one-line typed error, in bounded time and memory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from taskhandler_devenv.packers import (
    GO_FOOTER_MAGIC,
    GO_TRAILER,
    hostile_jar,
    pack_go_bundle,
    pack_go_bundle_raw,
    write_go_bundle,
    write_jar,
    write_typescript_bundle,
)
from taskhandler_operator.artifacts import go, java, listing
from taskhandler_operator.artifacts.listing import list_candidates
from taskhandler_operator.artifacts.models import (
    ArtifactVerificationError,
    Language,
    OpenFile,
    VerificationTimeout,
    quote,
)
from taskhandler_operator.artifacts.verify import verify_artifact
from taskhandler_operator.cli import main
from tests.unit.artifacts.helpers import read_with

pytestmark = pytest.mark.timeout(120)

BINARY = b"\x7fELF" + bytes(60)
HANDLER = {
    "Main-Class": "org.example.Handlers",
    "Airflow-Cache-Digest": "d" * 64,
    "Airflow-Supervisor-Schema-Version": "2026-10-30",
}


def verify_error(path: Path, language: Language, **kw: object) -> str:
    with pytest.raises(ArtifactVerificationError) as caught:
        verify_artifact(path, language, bundle_root=path.parent, **kw)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- 1. unbounded expansion in error paths ------------------------------------------------------


def billion_laughs(levels: int = 9) -> bytes:
    """A YAML alias chain: ten references per level, 10**levels strings once expanded."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels + 1):
        refs = ",".join([f"*l{level - 1}"] * 10)
        lines.append(f"l{level}: &l{level} [{refs}]")
    lines += [
        "sdk: {supervisor_schema_version: '2026-10-30'}",
        f"sources: [{{path: a, offset: 0, length: 0, sha256: {hashlib.sha256(b'').hexdigest()}}}]",
        f"entrypoint_path: *l{levels}",
        f"dag_source_paths: {{dag: *l{levels}}}",
    ]
    return ("\n".join(lines) + "\n").encode()


def test_go_yaml_alias_chain_is_refused_in_bounded_time_and_memory(tmp_path: Path) -> None:
    path = tmp_path / "etl"
    path.write_bytes(pack_go_bundle_raw(BINARY, billion_laughs()))
    path.chmod(0o755)
    tracemalloc.start()
    started = time.monotonic()
    try:
        message = verify_error(path, Language.GO)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == (
        "etl: metadata region uses YAML anchors or aliases, which Airflow metadata never needs "
        "(refused: an alias chain can expand without bound)"
    )
    assert peak < 16 * 1024 * 1024
    assert time.monotonic() - started < 60  # minutes before the fix; the test timeout guards
    # Listing reads the region for the digest: the refusal there just means "no digest".
    candidate = read_with(go.read_candidate, path)
    assert candidate is not None and candidate.cache_digest is None


def test_go_error_quotes_at_most_a_short_prefix_of_a_huge_value(tmp_path: Path) -> None:
    # No alias needed: a 900 KiB entrypoint path used to be quoted whole.
    huge = "p" * (900 * 1024)
    metadata = (
        "sdk: {supervisor_schema_version: '2026-10-30'}\n"
        f"sources: [{{path: a, offset: 0, length: 0, sha256: {hashlib.sha256(b'').hexdigest()}}}]\n"
        f"entrypoint_path: {huge}\n"
    ).encode()
    path = tmp_path / "etl"
    path.write_bytes(pack_go_bundle_raw(BINARY, metadata))
    path.chmod(0o755)
    assert verify_error(path, Language.GO) == (
        f"etl: metadata entrypoint_path '{'p' * 80}'… is not one of the listed sources"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("x" * 1000, "'" + "x" * 80 + "'…"),
        ("a\nb", "'a\\nb'"),
        (b"\xff" * 3, "b'\\xff\\xff\\xff'"),
        (10**5000, "an integer of 16610 bits"),
        (-(2**63), str(-(2**63))),
        (True, "True"),
        (None, "None"),
        (1.5, "1.5"),
        ([[1]] * 10**6, "a list of 1000000 item(s)"),
        ({"a": 1}, "a mapping of 1 key(s)"),
        (object(), "a object"),
    ],
    ids=lambda value: type(value).__name__,
)
def test_quote_never_renders_more_than_a_prefix(value: object, shown: str) -> None:
    assert quote(value) == shown


def test_verification_has_a_deadline(tmp_path: Path) -> None:
    # A sparse 4 GiB "binary": hashing it takes seconds, the deadline is a fraction of one.
    path = tmp_path / "etl"
    with path.open("wb") as handle:
        handle.truncate(4 << 30)
        handle.seek(4 << 30)
        metadata = b"sdk: {supervisor_schema_version: '2026-10-30'}\n"
        handle.write(metadata)
        handle.write(GO_TRAILER.pack(0, len(metadata), 1, bytes(32), bytes(12), GO_FOOTER_MAGIC))
    path.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(VerificationTimeout) as caught:
        verify_artifact(path, Language.GO, timeout=0.05)
    assert str(caught.value) == (
        f"{path}: verification did not finish within 0.05s (a very large artifact, a slow "
        "disk, or a hostile file)"
    )
    assert time.monotonic() - started < 30


# -- 2. integer overflow in the JAR reader -----------------------------------------------------

HOSTILE_JARS = {
    "manifest offset 2^63": {"manifest_offset64": 2**63},
    "manifest offset 2^64-1": {"manifest_offset64": 2**64 - 1},
    "manifest offset 2^63-1": {"manifest_offset64": 2**63 - 1},
    "central directory offset 2^64-1": {"cd_offset64": 2**64 - 1},
    "central directory offset 2^63": {"cd_offset64": 2**63},
}


def test_the_hostile_jar_builder_builds_a_valid_jar(tmp_path: Path) -> None:
    path = tmp_path / "good.jar"
    path.write_bytes(hostile_jar())
    candidate = read_with(java.read_candidate, path)
    assert candidate is not None and candidate.error is None
    assert verify_artifact(path, Language.JAVA).main_class == "org.example.Handlers"


@pytest.mark.parametrize("case", HOSTILE_JARS)
def test_zip64_values_past_the_file_are_errors_not_overflows(case: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.jar"
    path.write_bytes(hostile_jar(**HOSTILE_JARS[case]))
    with OpenFile.open(path) as f, pytest.raises(java.ZipFormatError, match="outside the file"):
        java.read_manifest_bytes(f)
    assert read_with(java.read_candidate, path) is None  # unreadable: skipped like any file
    assert verify_error(path, Language.JAVA).startswith("bad.jar: cannot read its manifest: ")


@pytest.mark.parametrize("offset", [2**63, 2**64 - 1, -1])
def test_reads_past_the_file_return_nothing(offset: int, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    with OpenFile.open(path) as f:
        assert f.read_at(offset, 10) == b""
        assert f.read_at(1, 2**64) == b"bc"


@pytest.mark.parametrize("case", HOSTILE_JARS)
def test_inspect_survives_a_hostile_jar(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.jar").write_bytes(hostile_jar(**HOSTILE_JARS[case]))
    write_jar(tmp_path / "good.jar", manifest=HANDLER)
    assert main(["inspect", str(tmp_path), "--language", "java"]) == 0
    out = capsys.readouterr().out
    assert "good.jar" in out and "1 candidate(s)" in out


# -- 3. one bad file poisons its neighbours ------------------------------------------------------


@pytest.mark.parametrize("case", HOSTILE_JARS)
def test_a_hostile_neighbour_does_not_break_a_good_jar(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_jar(tmp_path / "app" / "handlers.jar", manifest=HANDLER)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "dep.jar").write_bytes(hostile_jar(**HOSTILE_JARS[case]))
    verified = verify_artifact(good, Language.JAVA, bundle_root=tmp_path)
    assert verified.main_class == "org.example.Handlers"
    assert main(["plan", str(tmp_path), "--bundle-name", "b"]) == 0
    out = capsys.readouterr().out
    assert "app/handlers.jar" in out and "1 to probe" in out


def test_a_thin_jar_names_the_unreadable_dependency_it_needed(tmp_path: Path) -> None:
    thin = {k: v for k, v in HANDLER.items() if k != "Airflow-Supervisor-Schema-Version"}
    good = write_jar(tmp_path / "handlers.jar", manifest=thin)
    (tmp_path / "sdk.jar").write_bytes(hostile_jar(manifest_offset64=2**64 - 1))
    message = verify_error(good, Language.JAVA)
    assert message == (
        "handlers.jar: no Airflow-Supervisor-Schema-Version: neither its manifest nor any other "
        "JAR of the bundle (the airflow-sdk JAR a thin JAR relies on) declares one (dependency "
        "'sdk.jar' is unreadable: the manifest's local header lies outside the file)"
    )


def test_a_reader_crash_is_a_problem_on_that_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand in for any reader bug a hostile file may still find.
    real = java.read_candidate

    def crashing(f: OpenFile, rel_path: str) -> object:
        if rel_path == "bad.jar":
            raise OverflowError("Python int too large to convert to C ssize_t")
        return real(f, rel_path)

    monkeypatch.setitem(listing.READERS, Language.JAVA, crashing)
    write_jar(tmp_path / "bad.jar", manifest=HANDLER)
    write_jar(tmp_path / "good.jar", manifest=HANDLER)
    result = list_candidates(tmp_path, Language.JAVA)
    assert [c.rel_path for c in result.candidates] == ["good.jar"]
    assert [(p.rel_path, p.message) for p in result.problems] == [
        (
            "bad.jar",
            "cannot be read by the java reader (OverflowError: Python int too large to convert "
            "to C ssize_t)",
        )
    ]


# -- 5. argument injection into the JVM ----------------------------------------------------------


@pytest.mark.parametrize("main_class", ["-version", "-XX:+PrintFlagsFinal", "a b", "x/Y"])
def test_main_class_that_is_not_a_class_name_is_refused(main_class: str, tmp_path: Path) -> None:
    path = write_jar(tmp_path / "app.jar", manifest={**HANDLER, "Main-Class": main_class})
    assert verify_error(path, Language.JAVA) == (
        f"app.jar: Main-Class {main_class!r} is not a Java class name (dot-separated "
        "identifiers), so the java launcher would not run it as a class"
    )


@pytest.mark.parametrize("name", ["x:y.jar", "lib:/dep.jar"])
def test_a_jar_whose_path_holds_the_classpath_separator_is_refused(
    name: str, tmp_path: Path
) -> None:
    good = write_jar(tmp_path / "app.jar", manifest=HANDLER)
    write_jar(tmp_path / name, manifest={})
    assert verify_error(good, Language.JAVA) == (
        f"app.jar: bundle JAR {name!r} cannot be put on a classpath: its path contains ':'; "
        "rename it"
    )


# -- 6. directories and names ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_a_bundle_root_that_is_a_symlink_loop(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    args = ["--language", "go"] if command == "inspect" else ["--bundle-name", "b"]
    assert main([command, str(loop), *args]) == 2
    err = capsys.readouterr().err
    assert err == f"{command}: {loop} cannot be resolved: it is a symlink loop\n"


def test_names_that_are_not_utf8_are_problems_and_print_on_strict_stdout(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_go_bundle(bundle / "good", BINARY)
    raw_name = os.fsencode(bundle) + b"/bad-\xff\xfe"
    with open(raw_name, "wb") as handle:
        handle.write((bundle / "good").read_bytes())
    Path(os.fsdecode(raw_name)).chmod(0o755)
    proc = subprocess.run(
        [sys.executable, "-m", "taskhandler_operator", "inspect", str(bundle), "--language", "go"],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode("utf-8")  # valid UTF-8, all of it
    assert "problem: bad-\\\\xff\\\\xfe: its name is not valid UTF-8, skipped (rename it)" in out
    assert "1 candidate(s)" in out


def test_a_newline_in_a_name_cannot_forge_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_go_bundle(tmp_path / "a\nrejected  fake-row  0  forged", BINARY)
    assert main(["inspect", str(tmp_path), "--language", "go"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # header, one row, the count
    assert lines[1].startswith("a\\nrejected  fake-row  0  forged")


def _make_dirs(fd: int, segment: str, count: int) -> int:
    """``count`` nested folders below ``fd`` by relative mkdir (no full path is ever built)."""
    for _ in range(count):
        os.mkdir(segment, dir_fd=fd)
        child = os.open(segment, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    return fd


def _write_at(fd: int, name: str, data: bytes) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=fd)
    try:
        os.write(out, data)
    finally:
        os.close(out)


def test_an_artifact_past_the_system_path_limit_is_a_problem(tmp_path: Path) -> None:
    # The root is deep already (about 3000 characters), so an artifact 1,200 characters below
    # it is within the database's 2000 but past PATH_MAX (4096): lstat says ENAMETOOLONG.
    fd = _make_dirs(os.open(tmp_path, os.O_RDONLY), "r" * 250, 12)
    root = tmp_path.joinpath(*["r" * 250] * 12)
    fd = _make_dirs(fd, "d" * 250, 4)
    _write_at(fd, "e" * 200, pack_go_bundle(BINARY))
    os.close(fd)
    result = list_candidates(root, Language.GO)
    assert result.candidates == []
    assert [p.message for p in result.problems] == ["cannot be read, skipped (File name too long)"]
    assert result.problems[0].rel_path.endswith("/" + "e" * 200)


def test_a_path_longer_than_the_database_stores_is_a_problem(tmp_path: Path) -> None:
    fd = _make_dirs(os.open(tmp_path, os.O_RDONLY), "d" * 250, 8)
    _write_at(fd, "etl", pack_go_bundle(BINARY))
    os.close(fd)
    result = list_candidates(tmp_path, Language.GO)
    assert result.candidates == []
    (problem,) = result.problems
    assert problem.message == (
        "its path is 2007 characters, longer than the 2000 the database stores, skipped"
    )


# -- 7. inputs read whole without a bound ---------------------------------------------------------


def test_plan_known_refuses_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path), "--bundle-name", "b", "--known", "/dev/zero"]) == 2
    assert capsys.readouterr().err == "plan: --known /dev/zero: is not a regular file\n"


def test_plan_known_refuses_a_fifo_without_hanging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["plan", str(tmp_path), "--bundle-name", "b", "--known", str(fifo)]) == 2
    assert capsys.readouterr().err == f"plan: --known {fifo}: is not a regular file\n"


def test_plan_known_refuses_a_file_over_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as handle:
        handle.truncate((64 << 20) + 1)  # sparse: nothing is read
    assert main(["plan", str(tmp_path), "--bundle-name", "b", "--known", str(big)]) == 2
    assert capsys.readouterr().err == (
        f"plan: --known {big}: is 67108865 bytes, more than the 67108864-byte limit\n"
    )


# -- 9. accepted where Airflow's own worker refuses ---------------------------------------------


def test_a_dependency_jar_with_main_class_is_not_an_artifact(tmp_path: Path) -> None:
    path = write_jar(tmp_path / "spark.jar", manifest={"Main-Class": "org.apache.spark.Main"})
    assert verify_error(path, Language.JAVA) == (
        "spark.jar: has no Airflow-Cache-Digest manifest attribute, so it is not an artifact "
        "the Java runtime runs (a dependency JAR of the bundle?)"
    )


UTF8_METADATA = (
    b'{"airflow_bundle_metadata_version":"1.0","sdk":{"supervisor_schema_version":"2026-10-30"}}'
)


@pytest.mark.parametrize(
    ("encoding", "reason"),
    [
        ("utf-16", "is not UTF-8 (invalid start byte at byte 0)"),
        ("utf-32", "is not UTF-8 (invalid start byte at byte 0)"),
        # No BOM: valid UTF-8 (NUL bytes), so it is read as UTF-8 and is not JSON.
        ("utf-16-be", "is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    ],
)
def test_typescript_metadata_must_be_utf8(encoding: str, reason: str, tmp_path: Path) -> None:
    # json.loads on bytes guessed UTF-16/32 from a BOM or from zero bytes, and accepted these.
    payload = UTF8_METADATA.decode()
    path = write_typescript_bundle(
        tmp_path / "x.min.mjs", b"export{}", metadata_payload=payload.encode(encoding)
    )
    assert verify_error(path, Language.TYPESCRIPT) == f"x.min.mjs: the metadata line {reason}"


def test_typescript_metadata_in_utf8_still_verifies(tmp_path: Path) -> None:
    path = write_typescript_bundle(
        tmp_path / "x.min.mjs", b"export{}", metadata_payload=UTF8_METADATA
    )
    assert verify_artifact(path, Language.TYPESCRIPT).schema_version == "2026-10-30"


@pytest.mark.parametrize("language", list(Language))
def test_verify_refuses_a_schema_version_this_supervisor_does_not_support(
    language: Language, tmp_path: Path
) -> None:
    if language is Language.GO:
        path = write_go_bundle(tmp_path / "etl", BINARY, schema_version="2030-01-01")
    elif language is Language.TYPESCRIPT:
        path = write_typescript_bundle(tmp_path / "x.min.mjs", b"x", schema_version="2030-01-01")
    else:
        path = write_jar(
            tmp_path / "a.jar",
            manifest={**HANDLER, "Airflow-Supervisor-Schema-Version": "2030-01-01"},
        )
    with pytest.raises(ArtifactVerificationError) as caught:
        verify_artifact(path, language)
    assert str(caught.value) == (
        f"{path} uses supervisor schema version '2030-01-01', which this supervisor does not "
        "support (supported: 2026-06-16 to 2026-10-30: 2026-10-30, 2026-09-30, 2026-08-02, "
        "2026-07-30, 2026-06-30, 2026-06-23, 2026-06-16)"
    )


@pytest.mark.parametrize("version", ["1" * 5000 + ".0", "1." + "0" * 5000, "1.0." + "9" * 10])
def test_a_huge_metadata_version_gets_our_message(version: str, tmp_path: Path) -> None:
    path = write_typescript_bundle(
        tmp_path / "x.min.mjs",
        b"x",
        metadata_extra={"airflow_bundle_metadata_version": version},
    )
    assert verify_error(path, Language.TYPESCRIPT) == (
        "x.min.mjs: metadata airflow_bundle_metadata_version is missing or not "
        "MAJOR.MINOR[.PATCH] (numbers of at most 9 digits)"
    )


def test_a_huge_number_in_typescript_metadata_gets_our_message(tmp_path: Path) -> None:
    payload = (
        '{"airflow_bundle_metadata_version":"1.0","n":' + "7" * 5000 + ","
        '"sdk":{"supervisor_schema_version":"2026-10-30"}}'
    ).encode()
    path = write_typescript_bundle(tmp_path / "x.min.mjs", b"x", metadata_payload=payload)
    assert verify_error(path, Language.TYPESCRIPT) == (
        "x.min.mjs: the metadata line is not valid JSON (a number has too many digits)"
    )


def test_a_huge_number_in_go_metadata_gets_our_message(tmp_path: Path) -> None:
    metadata = b"sdk: {supervisor_schema_version: '2026-10-30'}\nn: " + b"7" * 5000 + b"\n"
    path = tmp_path / "etl"
    path.write_bytes(pack_go_bundle_raw(BINARY, metadata))
    path.chmod(0o755)
    assert verify_error(path, Language.GO) == (
        "etl: metadata region is not valid YAML (a value cannot be read, such as a number with "
        "too many digits)"
    )
