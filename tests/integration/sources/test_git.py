"""Git sources with the real git CLI over HTTP (git http-backend, basic auth) and SSH (sshd)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from taskhandler_operator.sources import mirrors
from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    AuthenticationFailed,
    InvalidSource,
    NotFound,
    SourceError,
    SourceTimeout,
    UnsupportedContent,
)
from taskhandler_operator.sources.git import mirror_path
from taskhandler_operator.sources.locks import try_file_lock
from taskhandler_operator.sources.store import RevisionStore
from tests.fixtures.sources import (
    HTTP_USER,
    PLANTED_PASSWORD,
    PLANTED_TOKEN,
    GitRepo,
    HttpServer,
    SshServer,
    make_repo,
    run_git,
)
from tests.integration.sources.conftest import NAMESPACE, fingerprint, read_tree, sync_source

pytestmark = pytest.mark.integration

BASIC = {"username": HTTP_USER.encode(), "password": PLANTED_PASSWORD.encode()}
FILES = {"go/handler": "binary", "lib/app.jar": "jar", "README.md": "hello"}


def git(url: str, ref: str = "main", path: str = "") -> dict[str, object]:
    return {"git": {"url": url, "ref": ref, "path": path, "secretRef": {"name": "creds"}}}


def ssh_credentials(sshd: SshServer) -> dict[str, bytes]:
    return {"identity": sshd.client_key.encode(), "known_hosts": sshd.known_hosts.encode()}


def since(server: HttpServer, repo: GitRepo, start: int) -> list[dict[str, object]]:
    return server.requests(f"/git/{repo.name}.git")[start:]


# -- refs ----------------------------------------------------------------------------------------


async def test_branch_sync_and_identity(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    commit = git_repo.commit(FILES)
    revision = await sync_source(store, git(git_repo.http_url(source_http)), BASIC)
    assert revision.id == commit
    assert revision.source == f"main@sha1:{commit}"
    assert read_tree(revision.path) == {k: v.encode() for k, v in FILES.items()}
    assert (revision.kind, revision.file_count) == ("git", 3)


async def test_unchanged_remote_fetches_and_writes_nothing(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    git_repo.commit(FILES)
    url = git_repo.http_url(source_http)
    first = await sync_source(store, git(url), BASIC)
    before = fingerprint(store.root)
    seen = len(source_http.requests(f"/git/{git_repo.name}.git"))
    again = await sync_source(store, git(url), BASIC)
    assert again == first
    assert fingerprint(store.root) == before  # mirror cache included: nothing fetched
    requests = since(source_http, git_repo, seen)
    # Only the ref advertisement (ls-remote): a couple of small answers, no pack.
    assert sum(int(r["bytes"]) for r in requests) < 4096, requests  # type: ignore[call-overload]


async def test_a_new_commit_is_a_new_revision_fetching_only_new_objects(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    big = os.urandom(2 << 20)
    git_repo.commit({"big.bin": big, "small.txt": "v1"})
    url = git_repo.http_url(source_http)
    first = await sync_source(store, git(url), BASIC)
    first_bytes = sum(int(r["bytes"]) for r in source_http.requests(f"/git/{git_repo.name}.git"))
    seen = len(source_http.requests(f"/git/{git_repo.name}.git"))
    second_commit = git_repo.commit({"small.txt": "v2"})
    second = await sync_source(store, git(url), BASIC)
    assert second.id == second_commit != first.id
    assert (second.path / "small.txt").read_text() == "v2"
    assert (second.path / "big.bin").read_bytes() == big
    assert (first.path / "small.txt").read_text() == "v1"
    again = sum(int(r["bytes"]) for r in since(source_http, git_repo, seen))  # type: ignore[call-overload]
    assert first_bytes > len(big)
    assert again < 64 * 1024, f"re-sync transferred {again} bytes"


async def test_tags_commits_and_explicit_refs(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    url = git_repo.http_url(source_http)
    old = git_repo.commit({"v.txt": "one"})
    annotated = git_repo.tag("v1.0.0")
    assert annotated == old
    git_repo.tag("light", annotated=False)
    new = git_repo.commit({"v.txt": "two"})
    git_repo.commit({"v.txt": "feature"}, branch="feature")

    tagged = await sync_source(store, git(url, "v1.0.0"), BASIC, bundle="tag")
    assert (tagged.id, tagged.source) == (old, f"v1.0.0@sha1:{old}")
    assert (tagged.path / "v.txt").read_text() == "one"
    light = await sync_source(store, git(url, "light"), BASIC, bundle="light")
    assert light.id == old
    by_commit = await sync_source(store, git(url, old), BASIC, bundle="commit")
    assert (by_commit.id, by_commit.source) == (old, f"sha1:{old}")
    explicit = await sync_source(store, git(url, "refs/heads/main"), BASIC, bundle="explicit")
    assert explicit.id == new
    feature = await sync_source(store, git(url, "feature"), BASIC, bundle="feature")
    assert (feature.path / "v.txt").read_text() == "feature"


async def test_a_name_that_is_both_branch_and_tag_must_be_spelled_out(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    url = git_repo.http_url(source_http)
    git_repo.commit({"a": "1"})
    git_repo.tag("main", annotated=False)
    with pytest.raises(InvalidSource, match="both a branch and a tag named 'main'"):
        await sync_source(store, git(url), BASIC)
    assert (await sync_source(store, git(url, "refs/tags/main"), BASIC)).file_count == 1


async def test_sub_path(git_repo: GitRepo, source_http: HttpServer, store: RevisionStore) -> None:
    commit = git_repo.commit(FILES)
    revision = await sync_source(store, git(git_repo.http_url(source_http), path="lib"), BASIC)
    assert read_tree(revision.path) == {"app.jar": b"jar"}
    assert revision.id.startswith(f"{commit}-") and len(revision.id) == 53


@pytest.mark.parametrize(
    ("ref", "path", "error", "text"),
    [
        ("missing-branch", "", NotFound, "no branch or tag of that name"),
        ("main", "no/such/dir", NotFound, "does not exist in commit"),
        ("main", "README.md", InvalidSource, "is a file, not a folder"),
        ("0" * 40, "", NotFound, "0000000000"),
    ],
)
async def test_missing_refs_and_paths(
    git_repo: GitRepo,
    source_http: HttpServer,
    store: RevisionStore,
    ref: str,
    path: str,
    error: type[SourceError],
    text: str,
) -> None:
    git_repo.commit(FILES)
    with pytest.raises(error, match=text):
        await sync_source(store, git(git_repo.http_url(source_http), ref, path), BASIC)


async def test_missing_repository(source_http: HttpServer, store: RevisionStore) -> None:
    with pytest.raises(NotFound, match="check the URL"):
        await sync_source(store, git(f"{source_http.base}/git/absent.git"), BASIC)


async def test_lfs_pointers_and_submodules_are_refused(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    url = git_repo.http_url(source_http)
    pointer = (
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
        "size 12345\n"
    )
    git_repo.commit({"bundle/app.jar": pointer, "other/x": "fine"})
    with pytest.raises(UnsupportedContent, match=r"'bundle/app.jar'.*Git LFS pointer"):
        await sync_source(store, git(url, path="bundle"), BASIC)
    # The pointer outside the bundle path does not matter.
    assert (await sync_source(store, git(url, path="other"), BASIC)).file_count == 1

    head = run_git("rev-parse", "HEAD", cwd=git_repo.work)
    run_git("update-index", "--add", "--cacheinfo", f"160000,{head},vendored", cwd=git_repo.work)
    run_git("commit", "-q", "-m", "submodule", cwd=git_repo.work)
    run_git("push", "-q", str(git_repo.bare), "main:refs/heads/main", cwd=git_repo.work)
    with pytest.raises(UnsupportedContent, match=r"'vendored'.*submodule"):
        await sync_source(store, git(url), BASIC, bundle="with-submodule")


def hostile_commit(
    repo: GitRepo, name: bytes, mode: bytes = b"100644", branch: str = "main"
) -> str:
    """A commit whose root tree holds ``name`` beside a good file, written with git's plumbing
    (``hash-object --literally`` skips the checks ``mktree`` and ``commit`` would make), and
    pushed as ``branch``: what a hostile server can hand out."""
    import subprocess

    def plumb(*args: str, data: bytes) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=repo.work, input=data, capture_output=True, check=True
        )
        return proc.stdout.decode().strip()

    blob = bytes.fromhex(plumb("hash-object", "-w", "--stdin", data=b"pwned\n"))
    good = bytes.fromhex(plumb("hash-object", "-w", "--stdin", data=b"fine\n"))
    tree = mode + b" " + name + b"\0" + blob + b"100644 ok.txt\0" + good
    tree_id = plumb("hash-object", "-t", "tree", "-w", "--literally", "--stdin", data=tree)
    commit = run_git("commit-tree", tree_id, "-m", "hostile", cwd=repo.work)
    run_git("push", "-q", "--force", str(repo.bare), f"{commit}:refs/heads/{branch}", cwd=repo.work)
    return commit


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        (b"..", b"100644"),
        (b".git", b"100644"),
        (b".GIT", b"100644"),
        (b".git.", b"100644"),
        (b"git~1", b"100644"),
        # Names only git's own check knows: caught from git archive's "invalid path".
        (b".git::$INDEX_ALLOCATION", b"100644"),
        (b".gitmodules", b"120000"),
    ],
    ids=[
        "dotdot",
        "dotgit",
        "DOTGIT",
        "dotgit-dot",
        "ntfs-short",
        "ntfs-stream",
        "gitmodules-link",
    ],
)
async def test_tree_entries_git_refuses_are_a_refused_revision(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore, name: bytes, mode: bytes
) -> None:
    """Such a commit can never sync: a permanent ArchiveRefused naming the commit, not the
    retryable GitFetchFailed; the previous revision stays current and nothing is written."""
    url = git_repo.http_url(source_http)
    git_repo.commit(FILES)
    previous = await sync_source(store, git(url), BASIC)
    commit = hostile_commit(git_repo, name, mode)
    with pytest.raises(ArchiveRefused) as info:
        await sync_source(store, git(url), BASIC)
    error = info.value
    assert error.reason == "ArchiveRefused" and error.permanent
    assert f"commit {commit}" in error.message and "can never be synced" in error.message
    assert name.decode() in error.message
    assert await store.revisions(NAMESPACE, "bundle") == [previous]


async def test_authentication_failures(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    git_repo.commit(FILES)
    url = git_repo.http_url(source_http)
    with pytest.raises(AuthenticationFailed, match="set secretRef"):
        await sync_source(store, {"git": {"url": url}})
    wrong = {"username": HTTP_USER.encode(), "password": b"thop-wrong-password-77"}
    with pytest.raises(AuthenticationFailed, match="check the credentials") as info:
        await sync_source(store, git(url), wrong)
    assert "thop-wrong-password-77" not in "".join(traceback.format_exception(info.value))
    with pytest.raises(InvalidSource, match="token, or username and password"):
        await sync_source(store, git(url), {"identity": b"key"})


async def test_token_auth(git_repo: GitRepo, source_http: HttpServer, store: RevisionStore) -> None:
    git_repo.commit(FILES)
    credentials = {"username": HTTP_USER.encode(), "token": PLANTED_TOKEN.encode()}
    revision = await sync_source(store, git(git_repo.http_url(source_http)), credentials)
    assert revision.file_count == 3


def git_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if marker in cmdline and proc.pid != os.getpid():
            found.append(proc)
    return found


async def test_a_hanging_server_is_bounded_and_git_is_killed(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    git_repo.commit(FILES)
    source_http.control("git", hang=30)
    try:
        started = time.monotonic()
        with pytest.raises(SourceTimeout, match="did not finish within 2s"):
            await sync_source(store, git(git_repo.http_url(source_http)), BASIC, within=2.0)
        assert time.monotonic() - started < 30
    finally:
        source_http.control("git")
    assert git_processes(git_repo.name) == []  # no git left running
    base = store.root / NAMESPACE / "bundle"
    assert not any(p.name.startswith(".tmp-") for p in base.iterdir())


# -- ssh -----------------------------------------------------------------------------------------


async def test_ssh_branch_and_unchanged(
    git_repo: GitRepo, sshd_server: SshServer, store: RevisionStore
) -> None:
    commit = git_repo.commit(FILES)
    url = git_repo.ssh_url(sshd_server)
    revision = await sync_source(store, git(url), ssh_credentials(sshd_server))
    assert (revision.id, revision.source) == (commit, f"main@sha1:{commit}")
    assert read_tree(revision.path) == {k: v.encode() for k, v in FILES.items()}
    before = fingerprint(store.root)
    assert await sync_source(store, git(url), ssh_credentials(sshd_server)) == revision
    assert fingerprint(store.root) == before
    newer = git_repo.commit({"README.md": "v2"})
    assert (await sync_source(store, git(url), ssh_credentials(sshd_server))).id == newer


def test_sshd_listens_on_loopback_only(sshd_server: SshServer) -> None:
    listening = [
        c.laddr
        for c in psutil.Process(sshd_server.proc.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", sshd_server.port)]


async def test_ssh_refusals(
    git_repo: GitRepo, sshd_server: SshServer, store: RevisionStore, tmp_path: Path
) -> None:
    git_repo.commit(FILES)
    url = git_repo.ssh_url(sshd_server)
    with pytest.raises(InvalidSource, match="identity and known_hosts"):
        await sync_source(store, {"git": {"url": url}})
    with pytest.raises(InvalidSource, match="known_hosts"):
        await sync_source(store, git(url), {"identity": sshd_server.client_key.encode()})
    other_host = (
        f"[127.0.0.1]:{sshd_server.port} ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIHbRHq5ZY2fSHrJ4k2MEqO7p0E0hUUNY3WYAtIWdTQ8V"
    )
    bad_host = {"identity": sshd_server.client_key.encode(), "known_hosts": other_host.encode()}
    with pytest.raises(AuthenticationFailed, match="host key is not in the Secret's known_hosts"):
        await sync_source(store, git(url), bad_host)
    key = tmp_path / "stranger"
    keygen = await asyncio.create_subprocess_exec(
        "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)
    )
    assert await keygen.wait() == 0
    stranger = {"identity": key.read_bytes(), "known_hosts": sshd_server.known_hosts.encode()}
    with pytest.raises(AuthenticationFailed, match="Permission denied"):
        await sync_source(store, git(url), stranger)


# -- credentials never show ----------------------------------------------------------------------


@dataclass
class Spy:
    """Wrappers for git and ssh on PATH that log each start's argv and environment, and a
    sampler reading every process's argv and environment while a sync runs."""

    log: Path
    seen: list[bytes] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        me = os.getpid()
        while not self.stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) == me:
                    continue
                for part in ("cmdline", "environ"):
                    with contextlib.suppress(OSError):  # the process may be gone already
                        self.seen.append((entry / part).read_bytes())
            time.sleep(0.002)

    def everything(self) -> bytes:
        return self.log.read_bytes() + b"\n".join(self.seen)


@pytest.fixture
def spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    import shutil

    folder = tmp_path / "spy-bin"
    folder.mkdir()
    log = tmp_path / "spy.log"
    log.touch()
    for tool in ("git", "ssh"):
        real = shutil.which(tool)
        assert real is not None
        wrapper = folder / tool
        wrapper.write_text(
            "#!/bin/sh\n"
            f'{{ printf "START {tool}"; printf " %s" "$@"; printf "\\n";'
            f' tr "\\000" "\\n" < /proc/$$/environ; }} >> {log}\n'
            f'exec {real} "$@"\n'
        )
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    result = Spy(log)
    thread = threading.Thread(target=result.sample, daemon=True)
    thread.start()
    yield result
    result.stop.set()
    thread.join(timeout=5)


def credential_folders(temp: Path) -> list[Path]:
    """Private credential folders (``thop-git-*``) still present in ``temp`` (in the folder
    volume sources may not read, sources/git.py: credentials_dir)."""
    return list(temp.rglob("thop-git-*"))


def secrets_in(text: bytes, planted: list[str]) -> list[str]:
    found = []
    for secret in planted:
        for line in secret.strip().splitlines():
            if len(line) >= 8 and line.encode() in text and "-----" not in line:
                found.append(line[:12] + "...")
    return found


async def test_planted_credentials_appear_nowhere(
    git_repo: GitRepo,
    source_http: HttpServer,
    sshd_server: SshServer,
    store: RevisionStore,
    spy: Spy,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    # A temp dir of our own: other processes on the machine may be syncing too.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    git_repo.commit(FILES)
    planted = [PLANTED_PASSWORD, PLANTED_TOKEN, sshd_server.client_key]
    errors: list[BaseException] = []
    # Successful syncs over HTTPS (password, token) and SSH (private key) ...
    await sync_source(store, git(git_repo.http_url(source_http)), BASIC, bundle="basic")
    token = {"username": HTTP_USER.encode(), "token": PLANTED_TOKEN.encode()}
    await sync_source(store, git(git_repo.http_url(source_http)), token, bundle="token")
    await sync_source(
        store, git(git_repo.ssh_url(sshd_server)), ssh_credentials(sshd_server), bundle="ssh"
    )
    # ... and failing ones, whose messages must not carry them either.
    wrong_user = {"username": b"nobody", "password": PLANTED_PASSWORD.encode()}
    for credentials, url in (
        (wrong_user, git_repo.http_url(source_http)),
        (ssh_credentials(sshd_server), git_repo.ssh_url(sshd_server).replace(".git", "-x.git")),
    ):
        with pytest.raises(SourceError) as info:
            await sync_source(store, git(url), credentials, bundle="failing")
        errors.append(info.value)
    # Control: a process that does carry a planted value in its argv is seen by the sampler.
    control = await asyncio.create_subprocess_exec("sh", "-c", "sleep 0.3", PLANTED_TOKEN)
    await control.wait()
    spy.stop.set()
    assert PLANTED_TOKEN.encode() in b"\n".join(spy.seen)
    spy.seen = [chunk for chunk in spy.seen if b"sleep 0.3" not in chunk]

    log_text = spy.log.read_bytes()
    assert b"START git" in log_text and b"START ssh" in log_text  # the wrappers saw the runs
    assert b"GIT_ASKPASS=" in log_text  # the askpass path is all git's environment holds
    assert len(spy.seen) > 100  # the sampler ran through the syncs
    assert secrets_in(spy.everything(), planted) == []
    assert secrets_in(caplog.text.encode(), planted) == []
    for error in errors:
        text = "".join(traceback.format_exception(error)).encode()
        assert secrets_in(text, planted) == []
    assert credential_folders(temp) == []  # removed after each sync
    assert spy.log.read_bytes().count(str(temp).encode()) > 0  # ... and they were made there


async def test_lock_files_left_by_a_killed_git_are_cleared(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    """git killed mid-fetch (SIGKILL, OOM) leaves ``*.lock`` files that would make every later
    fetch fail with "File exists"; the next sync, holding the mirror's lock, removes them."""
    from taskhandler_operator.sources.git import mirror_path

    url = git_repo.http_url(source_http)
    git_repo.commit(FILES)
    await sync_source(store, git(url), BASIC)
    mirror = mirror_path(store.cache_dir, url)
    for stale in ("shallow.lock", "refs/thop/fetched.lock", "packed-refs.lock"):
        (mirror / stale).write_text("")
    newer = git_repo.commit({"README.md": "after the crash"})
    revision = await sync_source(store, git(url), BASIC)
    assert revision.id == newer
    assert list(mirror.glob("*.lock")) == [] and list((mirror / "refs").glob("**/*.lock")) == []


# -- the mirror cache ------------------------------------------------------------------------


def mirrors_in(store: RevisionStore) -> list[str]:
    """Every entry of the mirrors folder (mirrors, their users folders, their lock files)."""
    folder = store.mirrors_dir
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def test_a_mirror_goes_with_the_last_bundle_that_uses_it(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore, tmp_path: Path
) -> None:
    git_repo.commit(FILES)
    other = make_repo(source_http.root / "git", f"other-{os.getpid()}", tmp_path)
    other.commit({"a.txt": "a"})
    first, second = git_repo.http_url(source_http), other.http_url(source_http)
    await sync_source(store, git(first), BASIC, bundle="a")
    await sync_source(store, git(first), BASIC, bundle="b")
    await sync_source(store, git(second), BASIC, bundle="c")
    one, two = mirror_path(store.cache_dir, first).name, mirror_path(store.cache_dir, second).name
    assert {one, two} <= set(mirrors_in(store))

    await store.delete_bundle(NAMESPACE, "a")
    assert one in mirrors_in(store)  # b still uses it
    # c moves to the first URL: the second mirror has no user left.
    await sync_source(store, git(first), BASIC, bundle="c")
    assert two not in mirrors_in(store) and f"{two}.users" not in mirrors_in(store)
    await store.delete_bundle(NAMESPACE, "b")
    await store.delete_bundle(NAMESPACE, "c")
    assert mirrors_in(store) == []
    # A new sync of a pruned URL fetches into a new mirror.
    revision = await sync_source(store, git(first), BASIC, bundle="d")
    assert read_tree(revision.path) == {k: v.encode() for k, v in FILES.items()}


async def test_mirrors_nobody_uses_are_removed_when_the_store_opens(
    git_repo: GitRepo, source_http: HttpServer, store: RevisionStore
) -> None:
    git_repo.commit(FILES)
    url = git_repo.http_url(source_http)
    await sync_source(store, git(url), BASIC, bundle="a")
    await sync_source(store, git(url), BASIC, bundle="b")
    mirror = mirror_path(store.cache_dir, url)
    # A mirror made before users were recorded (or whose users went in a crash).
    legacy = mirror.with_name("0" * 32)
    run_git("init", "-q", "--bare", str(legacy))
    await RevisionStore(store.root).open()
    assert sorted(mirrors_in(store)) == sorted(
        [mirror.name, f"{mirror.name}.lock", f"{mirror.name}.users"]
    )
    # Held by a sync (its lock taken): not removed, whatever the users say.
    for name in ("a", "b"):
        (mirrors.users_dir(mirror) / f"{NAMESPACE}_{name}").unlink()
    with try_file_lock(mirrors.lock_path(mirror)) as locked:
        assert locked
        assert mirrors.prune_mirror(mirror) is False
    assert mirrors.prune_mirror(mirror) is True
    assert mirrors_in(store) == []
