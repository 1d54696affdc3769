"""What the probe driver runs, and within which limits: pure, no I/O.

Commands follow reference ``airflow-langsdk.md`` §2.8 (Go), §3.5 (TypeScript) and §4.3 (Java).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from taskhandler_operator.artifacts.models import Language, VerifiedArtifact
from taskhandler_operator.limits import MAX_FRAME_SIZE
from taskhandler_operator.protocol.relay import RelayLimits

__all__ = ["ProbeConfig", "build_command", "runtime_environment"]


class ProbeConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    artifact: Path
    language: Language
    bundle_root: Path | None = None
    bundle_name: str | None = None
    answer_timeout: float = Field(default=60.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    exit_grace: float = Field(default=5.0, gt=0)
    max_frame_size: int = Field(default=MAX_FRAME_SIZE, ge=64)
    java: str = "java"
    node: str = "node"
    jvm_args: tuple[str, ...] = ()
    relay_limits: RelayLimits = RelayLimits()

    @property
    def effective_bundle_root(self) -> Path:
        return (self.bundle_root or self.artifact.parent).absolute()

    @property
    def effective_bundle_name(self) -> str:
        return self.bundle_name or self.effective_bundle_root.name or "bundle"


def build_command(
    verified: VerifiedArtifact,
    *,
    java: str = "java",
    node: str = "node",
    jvm_args: Sequence[str] = (),
) -> list[str]:
    """The runtime's argv before ``--comm``/``--logs`` (reference §2.8, §3.5, §4.3)."""
    if verified.language is Language.GO:
        # Absolute, so exec never searches PATH for the artifact.
        return [str(verified.path.absolute())]
    if verified.language is Language.TYPESCRIPT:
        return [node, str(verified.path.absolute())]
    if verified.main_class is None:
        raise ValueError(f"{verified.path}: no Main-Class to run")
    # Keep verification's order (sorted by path relative to the bundle root, reference §4.3);
    # re-sorting absolute paths would reorder JARs reached through symlinks.
    classpath = os.pathsep.join(p.absolute().as_posix() for p in verified.classpath)
    return [java, "-classpath", classpath, *jvm_args, verified.main_class]


def runtime_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The parent environment plus the logging settings a runtime cannot read from Airflow."""
    env = dict(base)
    env.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
    env.setdefault("AIRFLOW__LOGGING__NAMESPACE_LEVELS", "")
    return env
