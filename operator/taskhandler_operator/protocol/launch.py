"""What the probe driver runs, and within which limits: pure, no I/O.

Commands follow reference ``airflow-langsdk.md`` §2.8 (Go), §3.5 (TypeScript) and §4.3 (Java).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from taskhandler_operator.artifacts.java import is_java_binary_name
from taskhandler_operator.artifacts.models import Language, VerifiedArtifact
from taskhandler_operator.limits import ID_LENGTH, MAX_FRAME_SIZE, MAX_REQUEST_DAG_IDS
from taskhandler_operator.protocol.relay import RelayLimits

__all__ = [
    "ProbeConfig",
    "UnsafeCommand",
    "build_command",
    "is_java_binary_name",
    "runtime_environment",
]


class UnsafeCommand(ValueError):
    """The runtime's command line would not mean what verification checked."""


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
    # Sent as the request's ``dag_ids`` when set (see docs/protocol.md, "dag_ids"): runtimes of
    # the current protocol ignore it; older Go/Java runtimes answer only these Dags.
    dag_ids: tuple[str, ...] | None = Field(default=None, max_length=MAX_REQUEST_DAG_IDS)

    @field_validator("dag_ids")
    @classmethod
    def _dag_ids(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        for dag_id in value:
            if not dag_id or len(dag_id) > ID_LENGTH or "\x00" in dag_id:
                raise ValueError(f"a dag_id must be 1 to {ID_LENGTH} characters without NUL")
        return tuple(sorted(set(value)))

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
    """The runtime's argv before ``--comm``/``--logs`` (reference §2.8, §3.5, §4.3).

    Raises :class:`UnsafeCommand` when the command would not run what verification checked:
    a Main-Class that is not a Java binary class name, or a classpath entry that is relative
    or contains the path separator (``x:y.jar`` would become two entries, one of them
    resolved from the working directory).
    """
    if verified.language is Language.GO:
        # Absolute, so exec never searches PATH for the artifact.
        return [str(verified.path.absolute())]
    if verified.language is Language.TYPESCRIPT:
        return [node, str(verified.path.absolute())]
    main_class = verified.main_class
    if main_class is None:
        raise UnsafeCommand(f"{verified.path}: no Main-Class to run")
    if not is_java_binary_name(main_class):
        raise UnsafeCommand(
            f"{verified.path}: Main-Class {main_class[:80]!r} is not a Java class name"
        )
    entries: list[str] = []
    # Keep verification's order (sorted by path relative to the bundle root, reference §4.3);
    # re-sorting absolute paths would reorder JARs reached through symlinks.
    for path in verified.classpath:
        entry = path.as_posix()
        if not path.is_absolute() or os.pathsep in entry:
            raise UnsafeCommand(
                f"classpath entry {entry[:200]!r} is relative or contains {os.pathsep!r}"
            )
        entries.append(entry)
    return [java, "-classpath", os.pathsep.join(entries), *jvm_args, main_class]


def runtime_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The parent environment plus the logging settings a runtime cannot read from Airflow."""
    env = dict(base)
    env.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")
    env.setdefault("AIRFLOW__LOGGING__NAMESPACE_LEVELS", "")
    return env
