"""Git sources through the real ``git`` CLI, run as asyncio subprocesses.

A sync resolves the ref to a commit first (``git ls-remote``, or nothing for a full commit id):
when that commit's revision is kept, it is returned and nothing is fetched or written. Else
the commit is fetched shallowly into a per-URL bare mirror (``<store>/.cache/git/``), so a
later sync transfers only new objects; the bundle folder's tree is checked (entry and byte
caps, no submodules, no Git LFS pointers), written out with ``git archive`` and extracted
through the tree writer, which applies the same rules as any archive.

Credentials never reach an argument list, a URL, an environment variable, or a log line: they
are written to files (mode 0600) in a private folder (mode 0700) that exists only for the sync,
and handed to git through an askpass script (HTTPS) or ``GIT_SSH_COMMAND`` naming the key and
``known_hosts`` files (SSH). Only those paths appear in the environment of git and its children.
Git runs with no system or global configuration, no terminal prompts and no hooks, allowed
only the http, https and ssh transports; its process group is killed when the sync is
cancelled or times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shlex
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from taskhandler_operator.sources import mirrors
from taskhandler_operator.sources.archive import extract_archive
from taskhandler_operator.sources.credentials import secret_text
from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    AuthenticationFailed,
    GitFetchFailed,
    InvalidSource,
    NotFound,
    SourceError,
    UnsupportedContent,
    redact,
    shown_url,
)
from taskhandler_operator.sources.locks import file_lock
from taskhandler_operator.sources.spec import GitSource

if TYPE_CHECKING:
    from taskhandler_operator.sources.context import Build, SyncContext
    from taskhandler_operator.sources.models import Revision

__all__ = ["GitRunner", "credentials_dir", "mirror_path", "sync_git"]

log = logging.getLogger(__name__)

LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"
LFS_POINTER_MAX = 1024
STDERR_KEEP = 16 * 1024
# Configuration for every git command: nothing from the machine, no hooks, no helpers.
GIT_OPTIONS = (
    "-c", "protocol.allow=never",
    "-c", "protocol.https.allow=always",
    "-c", "protocol.http.allow=always",
    "-c", "protocol.ssh.allow=always",
    "-c", "credential.helper=",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "gc.autoDetach=false",
    "-c", "maintenance.autoDetach=false",
    "-c", "advice.detachedHead=false",
)  # fmt: skip
# Passed through from the operator's environment: proxies and CA bundles only.
PASSED_ENV = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO",
)  # fmt: skip
_SCP_LIKE = re.compile(r"^(?:[A-Za-z0-9._~-]+@)?[A-Za-z0-9.-]+:(?!//)")
_OID = re.compile(r"[0-9a-f]{40}")  # fullmatch: '$' also matches before a final newline


def is_ssh(url: str) -> bool:
    return url.startswith("ssh://") or _SCP_LIKE.match(url) is not None


def credentials_dir() -> Path:
    """Where each sync's private folder (credential files, git's HOME) is made: volume sources
    never read it (sources/access.py protects it), unlike the rest of the temporary folder."""
    return Path(tempfile.gettempdir()) / "taskhandler-operator-git"


def mirror_path(cache_dir: Path, url: str) -> Path:
    return cache_dir / "git" / hashlib.sha256(url.encode()).hexdigest()[:32]


async def _record_use(mirror: Path, ctx: SyncContext) -> None:
    """Record that the bundle uses ``mirror`` before the mirror's lock is taken (so a removal
    sees it), and release the mirror it used before a URL change."""
    bundle_dir = ctx.store.bundle_dir(ctx.namespace, ctx.bundle)
    previous = await ctx.blocking(mirrors.use, mirror, bundle_dir, ctx.namespace, ctx.bundle)
    if previous is not None:
        await ctx.blocking(mirrors.release, previous, ctx.namespace, ctx.bundle)


# -- credentials ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def git_environment(
    url: str, credentials: Mapping[str, bytes] | None, base_dir: Path | None = None
) -> AsyncIterator[dict[str, str]]:
    """The environment git runs with, and the private folder holding the credential files."""
    private = Path(
        await asyncio.to_thread(tempfile.mkdtemp, prefix="thop-git-", dir=base_dir)
    )  # mkdtemp: mode 0700, owned by us
    try:
        env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
        env.update(
            {
                "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
                "HOME": str(private),
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": os.devnull,
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_ASKPASS": "",
                "SSH_ASKPASS": "",
                "LC_ALL": "C",
            }
        )
        if is_ssh(url):
            env["GIT_SSH_COMMAND"] = await asyncio.to_thread(_ssh_files, private, credentials)
        elif credentials is not None:
            env["GIT_ASKPASS"] = await asyncio.to_thread(_askpass_files, private, credentials)
        yield env
    finally:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, private, True))


def _private_file(folder: Path, name: str, content: str, mode: int = 0o600) -> Path:
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(content)
    return path


def _askpass_files(private: Path, credentials: Mapping[str, bytes]) -> str:
    token = secret_text(credentials, "token")
    username = secret_text(credentials, "username")
    password = token if token is not None else secret_text(credentials, "password", strip=False)
    if password is None:
        raise InvalidSource(
            "the git source's Secret must hold token, or username and password, for an HTTPS "
            "URL (identity and known_hosts are for ssh:// URLs)"
        )
    user_file = _private_file(private, "username", username or "git")
    password_file = _private_file(private, "password", password)
    # git asks "Username for '...'" then "Password for '...'"; answer each from its file.
    script = (
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  Username*) exec cat {shlex.quote(str(user_file))} ;;\n"
        f"  *) exec cat {shlex.quote(str(password_file))} ;;\n"
        "esac\n"
    )
    return str(_private_file(private, "askpass", script, 0o700))


def _ssh_files(private: Path, credentials: Mapping[str, bytes] | None) -> str:
    identity = secret_text(credentials, "identity")
    known_hosts = secret_text(credentials, "known_hosts")
    if identity is None or known_hosts is None:
        raise InvalidSource(
            "an ssh git URL needs secretRef to a Secret with identity (a private key) and "
            "known_hosts (the server's host key: it is always checked)"
        )
    key = _private_file(private, "identity", identity + "\n")  # OpenSSH wants the final newline
    hosts = _private_file(private, "known_hosts", known_hosts + "\n")
    return " ".join(
        [
            "ssh",
            "-F",
            os.devnull,
            "-i",
            shlex.quote(str(key)),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "BatchMode=yes",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={shlex.quote(str(hosts))}",
            "-o",
            f"GlobalKnownHostsFile={os.devnull}",
            "-o",
            "ConnectTimeout=30",
            "-o",
            "LogLevel=ERROR",
        ]
    )


# -- running git ---------------------------------------------------------------------------


@dataclass
class GitResult:
    returncode: int
    stdout: bytes
    stderr: str


class GitRunner:
    """Runs ``git`` with the sync's environment; kills the process group when cancelled."""

    def __init__(self, env: dict[str, str], secrets: list[bytes]) -> None:
        self.env = env
        self.secrets = secrets

    async def run(
        self,
        *args: str,
        cwd: Path | None = None,
        stdin: bytes | None = None,
        stdout_limit: int = 1 << 20,
        too_much: str = "git printed more than expected",
    ) -> GitResult:
        proc = await asyncio.create_subprocess_exec(
            "git",
            *GIT_OPTIONS,
            *args,
            cwd=cwd,
            env=self.env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: ssh and helpers die with it
        )
        try:
            out, err, _ = await asyncio.gather(
                self._read_limited(proc, stdout_limit, too_much),
                self._read_tail(proc),
                self._feed(proc, stdin),
            )
            await proc.wait()
        except BaseException:
            _kill_group(proc)
            with contextlib.suppress(BaseException):
                await asyncio.shield(proc.wait())
            raise
        stderr = redact(err.decode("utf-8", "replace"), self.secrets)
        return GitResult(proc.returncode or 0, out, stderr)

    @staticmethod
    async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
        if data is None or proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()

    @staticmethod
    async def _read_limited(proc: asyncio.subprocess.Process, limit: int, too_much: str) -> bytes:
        assert proc.stdout is not None
        parts: list[bytes] = []
        size = 0
        while chunk := await proc.stdout.read(1 << 16):
            size += len(chunk)
            if size > limit:
                raise ArchiveRefused(too_much)
            parts.append(chunk)
        return b"".join(parts)

    @staticmethod
    async def _read_tail(proc: asyncio.subprocess.Process) -> bytes:
        assert proc.stderr is not None
        tail = b""
        while chunk := await proc.stderr.read(1 << 14):
            tail = (tail + chunk)[-STDERR_KEEP:]
        return tail


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


_BOILERPLATE = (
    "please make sure you have the correct access rights",
    "and the repository exists.",
)


def _last_lines(stderr: str, n: int = 3) -> str:
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and line.strip().lower() not in _BOILERPLATE
    ]
    # git prefixes its own lines with "fatal:"/"error:"; keep the end, where the cause is.
    return " | ".join(lines[-n:]) or "no output"


def _failure(what: str, url: str, result: GitResult, has_credentials: bool) -> SourceError:
    """A typed error for a failed git command, with git's own last words (redacted)."""
    text = result.stderr
    lowered = text.lower()
    detail = f"{what} {shown_url(url)} failed: {_last_lines(text)}"
    if "host key verification failed" in lowered or "remote host identification" in lowered:
        return AuthenticationFailed(
            f"{detail}; the server's host key is not in the Secret's known_hosts"
        )
    auth_markers = (
        "authentication failed",
        "could not read username",
        "could not read password",
        "permission denied",
        "invalid username or password",
        "http 401",
        "http 403",
        "error: 401",
        "error: 403",
        "returned error: 401",
        "returned error: 403",
    )
    if any(marker in lowered for marker in auth_markers):
        hint = (
            "check the credentials in the bundle's Secret"
            if has_credentials
            else "the server wants credentials: set secretRef"
        )
        return AuthenticationFailed(f"{detail}; {hint}")
    missing = (
        "repository not found",
        "does not appear to be a git repository",
        "not found",
        "returned error: 404",
        "no such file or directory",
    )
    if any(marker in lowered for marker in missing):
        return NotFound(f"{detail}; check the URL")
    return GitFetchFailed(detail)


# -- the sync ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    commit: str
    label: str  # what the identity is shown as: the ref, or "" for a commit
    full_ref: str = ""  # refs/heads/... or refs/tags/... ("" for a commit)


async def resolve_ref(git: GitRunner, spec: GitSource, has_credentials: bool) -> Resolved:
    if spec.is_commit:
        return Resolved(spec.ref, "")
    ref = spec.ref
    if ref.startswith("refs/"):
        patterns = [ref, f"{ref}^{{}}"]
    else:
        patterns = [f"refs/heads/{ref}", f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}"]
    result = await git.run("ls-remote", "--end-of-options", spec.url, *patterns)
    if result.returncode != 0:
        raise _failure("git ls-remote of", spec.url, result, has_credentials)
    found: dict[str, str] = {}
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        oid, _, name = line.partition("\t")
        if _OID.fullmatch(oid):
            found[name] = oid
    if ref.startswith("refs/"):
        commit = found.get(f"{ref}^{{}}") or found.get(ref)
        if commit is None:
            raise NotFound(f"ref {ref} not found in {shown_url(spec.url)}")
        return Resolved(commit, ref, ref)
    branch = found.get(f"refs/heads/{ref}")
    tag = found.get(f"refs/tags/{ref}^{{}}") or found.get(f"refs/tags/{ref}")
    if branch is not None and tag is not None:
        raise InvalidSource(
            f"{shown_url(spec.url)} has both a branch and a tag named {ref!r}; set ref to "
            f"refs/heads/{ref} or refs/tags/{ref}"
        )
    if branch is not None:
        return Resolved(branch, ref, f"refs/heads/{ref}")
    if tag is None:
        raise NotFound(
            f"ref {ref!r} not found in {shown_url(spec.url)}: no branch or tag of that name "
            "(a commit must be given as its full 40-character id)"
        )
    return Resolved(tag, ref, f"refs/tags/{ref}")


def revision_id(commit: str, path: str) -> str:
    if not path:
        return commit
    return f"{commit}-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


def _remove_stale_locks(mirror: Path) -> list[str]:
    """``*.lock`` files git left in the mirror when it was killed mid-fetch. Called with the
    mirror's own file lock held, so no git process of ours can be using them."""
    removed = []
    for folder in (mirror, mirror / "refs"):
        if not folder.is_dir():
            continue
        pattern = "**/*.lock" if folder.name == "refs" else "*.lock"
        for stale in folder.glob(pattern):
            stale.unlink(missing_ok=True)
            removed.append(str(stale.relative_to(mirror)))
    return removed


async def _ensure_mirror(git: GitRunner, mirror: Path) -> None:
    if await asyncio.to_thread((mirror / "HEAD").is_file):
        removed = await asyncio.to_thread(_remove_stale_locks, mirror)
        if removed:
            log.warning("removed stale git lock files from %s: %s", mirror, ", ".join(removed))
        return
    await asyncio.to_thread(mirror.parent.mkdir, parents=True, exist_ok=True)
    partial = mirror.with_name(f"{mirror.name}.tmp")
    await asyncio.to_thread(shutil.rmtree, partial, True)
    result = await git.run("init", "--bare", "--quiet", str(partial))
    if result.returncode != 0:
        raise GitFetchFailed(f"cannot create the git mirror cache: {_last_lines(result.stderr)}")
    await asyncio.to_thread(partial.rename, mirror)


async def _has_commit(git: GitRunner, mirror: Path, commit: str) -> bool:
    result = await git.run("cat-file", "-e", f"{commit}^{{commit}}", cwd=mirror)
    return result.returncode == 0


async def fetch_commit(
    git: GitRunner, mirror: Path, spec: GitSource, resolved: Resolved, has_credentials: bool
) -> str:
    """Fetch into the mirror; returns the commit now at the ref (it may have moved)."""
    if spec.is_commit:
        if await _has_commit(git, mirror, resolved.commit):
            return resolved.commit
        result = await git.run(
            "fetch", "--depth=1", "--no-tags", "--end-of-options", spec.url, resolved.commit,
            cwd=mirror,
        )  # fmt: skip
        if (
            result.returncode != 0
            and "not our ref" not in result.stderr.lower()
            and ("unadvertised" not in result.stderr.lower())
        ):
            raise _failure("git fetch of", spec.url, result, has_credentials)
        if result.returncode != 0:
            # A server that refuses fetching by id: take its branches and tags instead.
            shallow = await git.run("rev-parse", "--is-shallow-repository", cwd=mirror)
            extra = ["--unshallow"] if shallow.stdout.strip() == b"true" else []
            result = await git.run(
                "fetch", *extra, "--no-tags", "--end-of-options", spec.url,
                "+refs/heads/*:refs/thop/heads/*", "+refs/tags/*:refs/thop/tags/*",
                cwd=mirror,
            )  # fmt: skip
            if result.returncode != 0:
                raise _failure("git fetch of", spec.url, result, has_credentials)
        if not await _has_commit(git, mirror, resolved.commit):
            raise NotFound(f"commit {resolved.commit} not found in {shown_url(spec.url)}")
        return resolved.commit
    if await _has_commit(git, mirror, resolved.commit):
        return resolved.commit  # fetched before for another bundle or an earlier path
    result = await git.run(
        "fetch", "--depth=1", "--no-tags", "--end-of-options", spec.url,
        f"+{resolved.full_ref}:refs/thop/fetched", cwd=mirror,
    )  # fmt: skip
    if result.returncode != 0:
        raise _failure("git fetch of", spec.url, result, has_credentials)
    peeled = await git.run("rev-parse", "--verify", "refs/thop/fetched^{commit}", cwd=mirror)
    commit = peeled.stdout.decode().strip()
    if peeled.returncode != 0 or not _OID.fullmatch(commit):
        raise GitFetchFailed(f"git fetch of {shown_url(spec.url)} did not yield a commit")
    return commit


def _refused_by_git(part: str) -> bool:
    """A tree entry name git itself refuses to write out (``git archive`` fails with "invalid
    path"): a dot segment, or ``.git`` in any case or with the NTFS/HFS disguises git knows
    (trailing dots or spaces, the 8.3 short name). Such a commit can never be synced."""
    lowered = part.lower().rstrip(". ")
    return part in ("", ".", "..") or lowered in (".git", "git~1")


def _refused_tree(commit: str, url: str, detail: str) -> ArchiveRefused:
    return ArchiveRefused(
        f"commit {commit} of {shown_url(url)} refused: {detail}; that commit can never be "
        "synced: point ref at a commit without it"
    )


@dataclass(frozen=True)
class TreeCheck:
    entries: int
    bytes: int


async def check_tree(
    git: GitRunner, mirror: Path, spec: GitSource, commit: str, ctx: SyncContext
) -> TreeCheck:
    """Refuse what cannot become a revision before anything is written: a missing path,
    submodules, LFS pointers, and trees over the store's caps."""
    tree = f"{commit}:{spec.path}" if spec.path else commit
    kind = await git.run("cat-file", "-t", tree, cwd=mirror)
    if kind.returncode != 0:
        raise NotFound(f"path {spec.path!r} does not exist in commit {commit}")
    if kind.stdout.strip() != b"tree" and spec.path:
        raise InvalidSource(f"path {spec.path!r} in commit {commit} is a file, not a folder")
    limits = ctx.store.limits
    listing = await git.run(
        "ls-tree", "-r", "-t", "-l", "-z", "--full-tree", tree, cwd=mirror,
        stdout_limit=(limits.max_files + 1) * 1200,
        too_much=f"the tree has more than {limits.max_files} entries (the store's cap)",
    )  # fmt: skip
    if listing.returncode != 0:
        if "empty filename in tree entry" in listing.stderr:  # a malformed tree object
            raise _refused_tree(commit, spec.url, f"git ls-tree: {_last_lines(listing.stderr)}")
        raise GitFetchFailed(f"git ls-tree failed: {_last_lines(listing.stderr)}")
    entries = 0
    total = 0
    small_blobs: list[tuple[str, str]] = []
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind_name, oid, size = meta.split()[:4]
        path = raw_path.decode("utf-8", "surrogateescape")
        shown = f"{spec.path}/{path}" if spec.path else path
        entries += 1
        if any(_refused_by_git(part) for part in path.split("/")):
            raise _refused_tree(
                commit, spec.url, f"tree entry {shown[:200]!r} is a path git refuses to write out"
            )
        if kind_name == b"commit":
            raise UnsupportedContent(
                f"{shown!r} in commit {commit} is a git submodule; submodules are not "
                "supported: commit the files into the repository or use another source"
            )
        if kind_name == b"blob":
            blob_size = int(size)
            total += blob_size
            if mode != b"120000" and blob_size <= LFS_POINTER_MAX:
                small_blobs.append((oid.decode(), shown))
    if entries > limits.max_files:
        raise ArchiveRefused(
            f"the tree has {entries} entries, more than the store's cap of {limits.max_files}"
        )
    if total > limits.max_bytes:
        raise ArchiveRefused(
            f"the tree holds {total} bytes, more than the store's cap of {limits.max_bytes}"
        )
    await _refuse_lfs(git, mirror, small_blobs, commit)
    return TreeCheck(entries, total)


async def _refuse_lfs(
    git: GitRunner, mirror: Path, blobs: list[tuple[str, str]], commit: str
) -> None:
    if not blobs:
        return
    request = "".join(f"{oid}\n" for oid, _ in blobs).encode()
    result = await git.run(
        "cat-file", "--batch", cwd=mirror, stdin=request,
        stdout_limit=len(blobs) * (LFS_POINTER_MAX + 128),
    )  # fmt: skip
    if result.returncode != 0:
        raise GitFetchFailed(f"git cat-file failed: {_last_lines(result.stderr)}")
    out = result.stdout
    at = 0
    for _oid, shown in blobs:
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        content = out[header_end + 1 : header_end + 1 + size]
        at = header_end + 1 + size + 1
        if content.startswith(LFS_POINTER_PREFIX):
            raise UnsupportedContent(
                f"{shown!r} in commit {commit} is a Git LFS pointer; LFS is not supported: "
                "commit the artifact itself or use an http or s3 source"
            )


async def sync_git(
    spec: GitSource, credentials: Mapping[str, bytes] | None, ctx: SyncContext
) -> Revision:
    if is_ssh(spec.url) and credentials is None:
        raise InvalidSource(
            f"{shown_url(spec.url)} is an ssh URL: set secretRef to a Secret with identity and "
            "known_hosts"
        )
    secrets = list((credentials or {}).values())
    has_credentials = credentials is not None
    mirror = mirror_path(ctx.store.cache_dir, spec.url)
    await _record_use(mirror, ctx)
    # Credential files go to a folder no volume source may read (sources/access.py).
    private = credentials_dir()
    await asyncio.to_thread(private.mkdir, mode=0o700, parents=True, exist_ok=True)
    async with git_environment(spec.url, credentials, private) as env:
        git = GitRunner(env, secrets)
        resolved = await resolve_ref(git, spec, has_credentials)
        existing = await ctx.existing(revision_id(resolved.commit, spec.path))
        if existing is not None:
            return existing
        async with file_lock(mirror.with_name(f"{mirror.name}.lock")):
            await _ensure_mirror(git, mirror)
            commit = await fetch_commit(git, mirror, spec, resolved, has_credentials)
            if commit != resolved.commit:  # the branch moved between ls-remote and fetch
                existing = await ctx.existing(revision_id(commit, spec.path))
                if existing is not None:
                    return existing
            await check_tree(git, mirror, spec, commit, ctx)

            async def fill(build: Build) -> None:
                tar = build.staging.scratch / "tree.tar"
                tree = f"{commit}:{spec.path}" if spec.path else commit
                result = await git.run("archive", "--format=tar", "-o", str(tar), tree, cwd=mirror)
                if result.returncode != 0:
                    if "invalid path" in result.stderr:  # a name check_tree did not know
                        raise _refused_tree(
                            commit, spec.url, f"git archive: {_last_lines(result.stderr)}"
                        )
                    raise GitFetchFailed(f"git archive failed: {_last_lines(result.stderr)}")
                try:
                    await ctx.blocking(extract_archive, tar, "tar", build.writer)
                    await ctx.blocking(build.writer.finish)  # link checks, named with the commit
                except ArchiveRefused as exc:
                    raise ArchiveRefused(
                        f"commit {commit} of {shown_url(spec.url)} refused: {exc.message}"
                    ) from None
                build.revision_id = revision_id(commit, spec.path)
                label = resolved.label or ""
                build.source = f"{label}@sha1:{commit}" if label else f"sha1:{commit}"
                build.details = {
                    "url": shown_url(spec.url),
                    "ref": spec.ref,
                    "path": spec.path,
                    "commit": commit,
                }

            return await ctx.build("git", fill)
