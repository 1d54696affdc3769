"""BuildKit as a child process: ``buildkitd`` (rootful, runc worker, host network) and ``buildctl``.

hack/build-buildkit.sh builds both and runc into ``$THOP_CACHE/buildkit/<version-key>/``. The
daemon keeps its state (layer snapshots, the build cache) in a cached folder so that a changed
tree rebuilds only the steps it changes; RUN steps use the host's network, so apt-get and pip
reach their registries.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT = 30.0
RUNC_LOST_CONTAINER = "did not terminate successfully: exit status 1: container does not exist"


class BuildKitError(RuntimeError):
    """buildkitd did not start, or a buildctl build failed."""


@dataclass(frozen=True)
class BuildKitBins:
    """The three binaries of one hack/build-buildkit.sh build."""

    dir: Path

    @property
    def buildkitd(self) -> Path:
        return self.dir / "buildkitd"

    @property
    def buildctl(self) -> Path:
        return self.dir / "buildctl"

    @property
    def runc(self) -> Path:
        return self.dir / "runc"


def ensure_bins(repo: Path) -> BuildKitBins:
    """Run hack/build-buildkit.sh (a no-op when cached); its last stdout line is the bin dir."""
    done = subprocess.run(
        ["bash", str(repo / "hack" / "build-buildkit.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildKitError(f"hack/build-buildkit.sh failed ({done.returncode})")
    return BuildKitBins(Path(done.stdout.strip().splitlines()[-1]))


def bins_dir(repo: Path) -> Path:
    """Where hack/build-buildkit.sh keeps its build (without building)."""
    done = subprocess.run(
        ["bash", str(repo / "hack" / "build-buildkit.sh"), "--dir"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


@dataclass(frozen=True)
class Daemon:
    """A running buildkitd, reached at ``address``."""

    bins: BuildKitBins
    address: str

    def build(
        self,
        *,
        context: Path,
        dockerfile_dir: Path,
        opts: Sequence[tuple[str, str]],
        oci_layouts: Sequence[tuple[str, Path]],
        output: str,
        log: Path,
    ) -> None:
        """One ``buildctl build`` with the built-in dockerfile.v0 frontend; progress to ``log``."""
        cmd = [
            str(self.bins.buildctl),
            "--addr",
            self.address,
            "build",
            "--progress=plain",
            "--frontend=dockerfile.v0",
            f"--local=context={context}",
            f"--local=dockerfile={dockerfile_dir}",
            *(f"--opt={key}={value}" for key, value in opts),
            *(f"--oci-layout={name}={path}" for name, path in oci_layouts),
            f"--output={output}",
        ]
        for attempt in (1, 2):
            start = log.stat().st_size if log.exists() else 0
            with log.open("ab") as out:
                out.write(("$ " + " ".join(cmd) + "\n").encode())
                out.flush()
                done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode == 0:
                return
            with log.open("rb") as read:
                read.seek(start)
                tail = read.read().decode(errors="replace")
            # Seen once in a dozen builds here: BuildKit loses track of a RUN step's runc
            # container ("runc did not terminate successfully: ... container does not exist")
            # while the step's command reported no error. One more try is cheap (BuildKit's
            # cache keeps the steps done); a step that really fails fails again.
            if attempt == 1 and RUNC_LOST_CONTAINER in tail:
                continue
            raise BuildKitError(
                f"buildctl build failed ({done.returncode}); log {log}:\n{tail[-4000:]}"
            )

    def prune(self, keep_mb: int, log: Path) -> None:
        """Trim BuildKit's cache to ``keep_mb`` (oldest first): every changed base or tree leaves
        a few hundred MB of snapshots behind. A failed prune only leaves more cache."""
        with log.open("ab") as out:
            subprocess.run(
                [str(self.bins.buildctl), "--addr", self.address, "prune", "--all",
                 f"--keep-storage={keep_mb}"],
                stdout=out, stderr=subprocess.STDOUT, check=False,
            )  # fmt: skip


@contextlib.contextmanager
def running(bins: BuildKitBins, state: Path, log: Path) -> Iterator[Daemon]:
    """Start buildkitd (rootful, runc worker, host network), yield it, stop it."""
    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="thop-buildkitd-") as run_dir:
        address = f"unix://{run_dir}/buildkitd.sock"
        env = dict(os.environ)
        env["PATH"] = f"{bins.dir}:{env.get('PATH', '/usr/bin:/bin')}"
        # buildkitd resolves its own config and CNI files under XDG dirs; keep it off the user's.
        env["XDG_RUNTIME_DIR"] = run_dir
        cmd = [
            str(bins.buildkitd),
            f"--root={state}",
            f"--addr={address}",
            "--oci-worker=true",
            "--containerd-worker=false",
            f"--oci-worker-binary={bins.runc}",
            "--oci-worker-net=host",
            "--oci-worker-snapshotter=overlayfs",
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if proc.poll() is not None:
                    raise BuildKitError(
                        f"buildkitd exited ({proc.returncode}); log {log}:\n"
                        + log.read_text(errors="replace")[-3000:]
                    )
                probe = subprocess.run(
                    [str(bins.buildctl), "--addr", address, "debug", "workers"],
                    capture_output=True,
                    check=False,
                )
                if probe.returncode == 0 and probe.stdout.strip().count(b"\n") >= 1:
                    break
                if time.monotonic() > deadline:
                    raise BuildKitError(
                        f"buildkitd not ready after {START_TIMEOUT:.0f} s; log {log}"
                    )
                time.sleep(0.2)
            yield Daemon(bins, address)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
