"""Local implementations of the pass's ports: a folder as the source, the probe driver as a
local process. Used by the integration tests, and by anyone running a pass
without a cluster; the controller uses the ``sources`` package and probe Jobs instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from taskhandler_operator.protocol.summary import ProbeSummary, ResultRejected, accept_result
from taskhandler_operator.reconcile.models import (
    BundleSpec,
    ProbeAccepted,
    ProbeFailed,
    ProbeRequest,
    SyncedRevision,
)

#: Seconds a probe subprocess gets beyond its own answer timeout (connect, verify, exit grace).
PROBE_OVERHEAD_SECONDS = 30.0


def folder_revision(root: Path) -> str:
    """A revision id for a plain folder: a digest of every file's path, size and mtime.

    A stand-in for the content digests the ``sources`` package computes: it changes whenever a
    file is added, removed, resized or rewritten, and costs one ``stat`` per file.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"bundle folder {root} does not exist")
    digest = hashlib.sha256()
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(directory, name)
            try:
                st = path.lstat()
            except OSError:
                continue
            rel = path.relative_to(root).as_posix()
            digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "replace"))
    return f"folder:{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class LocalFolderSyncer:
    """The bundle's source is a folder on this machine, used in place."""

    root: Path

    async def __call__(self, spec: BundleSpec) -> SyncedRevision:
        revision = await asyncio.to_thread(folder_revision, self.root)
        return SyncedRevision(revision=revision, root=self.root)


def cli_command() -> tuple[str, ...]:
    """How to run this installation's ``taskhandler-operator``."""
    script = Path(sys.executable).parent / "taskhandler-operator"
    if script.is_file():
        return (str(script),)
    return (sys.executable, "-m", "taskhandler_operator")


@dataclass(frozen=True)
class SubprocessProber:
    """Runs ``taskhandler-operator probe`` as a local process, the way a probe Job's container
    does, and reads its answer the way the controller reads a Job's: the summary from the
    termination-message file, the result from the log line after the marker, accepted only
    when its SHA-256 matches the summary's (:func:`~taskhandler_operator.protocol.summary.
    accept_result`)."""

    command: Sequence[str] = field(default_factory=cli_command)
    answer_timeout: float = 60.0
    extra_args: Sequence[str] = ()
    # Where each probe's termination-message folder is made (default: the temp dir).
    scratch_root: Path | None = None

    def argv(self, request: ProbeRequest, termination_log: Path) -> list[str]:
        root = request.bundle_root
        return [
            *self.command,
            "probe",
            str(root / request.candidate.rel_path),
            *("--language", request.language.value, "--bundle-root", str(root)),
            *("--bundle-name", request.bundle_name, "--termination-log", str(termination_log)),
            *("--timeout", f"{self.answer_timeout:g}"),
            *(arg for dag_id in request.dag_ids or () for arg in ("--dag-id", dag_id)),
            *self.extra_args,
        ]

    async def __call__(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        rel_path = request.candidate.rel_path
        with tempfile.TemporaryDirectory(prefix="thop-probe-", dir=self.scratch_root) as scratch:
            termination_log = Path(scratch) / "termination-log"
            argv = self.argv(request, termination_log)
            shown = tuple(argv[len(self.command) :])
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                stdout, stderr = await asyncio.wait_for(
                    proc.communicate(), self.answer_timeout + PROBE_OVERHEAD_SECONDS
                )
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                return ProbeFailed(
                    rel_path,
                    f"the probe driver did not finish within "
                    f"{self.answer_timeout + PROBE_OVERHEAD_SECONDS:g} s",
                    retryable=True,
                    command=shown,
                )
            try:
                summary = ProbeSummary.model_validate_json(termination_log.read_bytes())
            except (OSError, ValidationError) as exc:
                return ProbeFailed(
                    rel_path,
                    f"the probe driver exited {proc.returncode} without a readable summary "
                    f"({type(exc).__name__})",
                    retryable=True,
                    command=shown,
                )
        if not summary.ok:
            return ProbeFailed(
                rel_path, summary.error or "the probe failed", summary=summary, command=shown
            )
        if stdout.strip() and _summary_of(stdout) != summary:
            return ProbeFailed(
                rel_path,
                "the probe's stdout and its termination message differ",
                summary=summary,
                command=shown,
            )
        try:
            # A large result is decoded and validated off the event loop.
            result = await asyncio.to_thread(
                accept_result, stderr.decode("utf-8", "replace"), summary
            )
        except ResultRejected as exc:
            return ProbeFailed(rel_path, str(exc), summary=summary, command=shown)
        return ProbeAccepted(rel_path, result, summary=summary, command=shown)


def _summary_of(stdout: bytes) -> ProbeSummary | None:
    try:
        return ProbeSummary.model_validate_json(stdout.strip().splitlines()[-1])
    except (ValidationError, IndexError):
        return None
