"""What the probe driver runs, and within which limits: pure, no I/O.

Commands follow reference ``airflow-langsdk.md`` §2.8 (Go), §3.5 (TypeScript) and §4.3 (Java).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from taskhandler_operator.artifacts.models import Language, VerifiedArtifact
from taskhandler_operator.limits import MAX_FRAME_SIZE, MAX_REQUEST_DAG_IDS
from taskhandler_operator.protocol.plain import dag_id_problem
from taskhandler_operator.protocol.relay import RelayLimits

__all__ = [
    "ProbeConfig",
    "UnsafeCommand",
    "build_command",
    "runtime_environment",
]


class UnsafeCommand(ValueError):
    """The runtime's command line would not mean what verification checked."""


@dataclass(frozen=True)
class ProbeConfig:
    """What one probe runs with. Validated on creation, by :class:`.options.ProbeOptions`' rules.

    Options that already have their types and bounds are taken as they are, without pydantic
    (a probe pod's usual case, and pydantic's import was most of a probe's own cost); anything
    else is validated by that model, which raises its ``ValidationError`` or coerces.
    """

    artifact: Path
    language: Language
    bundle_root: Path | None = None
    bundle_name: str | None = None
    answer_timeout: float = 60.0
    connect_timeout: float = 10.0
    exit_grace: float = 5.0
    max_frame_size: int = MAX_FRAME_SIZE
    java: str = "java"
    node: str = "node"
    jvm_args: tuple[str, ...] = ()
    relay_limits: RelayLimits = field(default_factory=RelayLimits)
    dag_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if _plainly_valid(self):
            for name in _SECONDS:
                object.__setattr__(self, name, float(getattr(self, name)))
            if self.dag_ids is not None:
                object.__setattr__(self, "dag_ids", tuple(sorted(set(self.dag_ids))))
            return
        from taskhandler_operator.protocol.options import ProbeOptions

        checked = ProbeOptions(**{f.name: getattr(self, f.name) for f in fields(self)})
        for f in fields(self):
            object.__setattr__(self, f.name, getattr(checked, f.name))

    @property
    def effective_bundle_root(self) -> Path:
        return (self.bundle_root or self.artifact.parent).absolute()

    @property
    def effective_bundle_name(self) -> str:
        return self.bundle_name or self.effective_bundle_root.name or "bundle"


_SECONDS = ("answer_timeout", "connect_timeout", "exit_grace")


def _number(value: object) -> bool:
    return type(value) is float or type(value) is int


def _plainly_valid(config: ProbeConfig) -> bool:
    """Every option of the type ProbeOptions declares and within its bounds (else it decides)."""
    dag_ids = config.dag_ids
    return (
        isinstance(config.artifact, Path)
        and isinstance(config.language, Language)
        and (config.bundle_root is None or isinstance(config.bundle_root, Path))
        and (config.bundle_name is None or type(config.bundle_name) is str)
        and all(_number(getattr(config, n)) and getattr(config, n) > 0 for n in _SECONDS)
        and type(config.max_frame_size) is int
        and config.max_frame_size >= 64
        and type(config.java) is str
        and type(config.node) is str
        and type(config.jvm_args) is tuple
        and all(type(arg) is str for arg in config.jvm_args)
        and type(config.relay_limits) is RelayLimits
        and (
            dag_ids is None
            or (
                type(dag_ids) is tuple
                and len(dag_ids) <= MAX_REQUEST_DAG_IDS
                and all(type(d) is str and dag_id_problem(d) is None for d in dag_ids)
            )
        )
    )


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
    # Here, not at the top: a Go or TypeScript probe need not import the JAR reader.
    from taskhandler_operator.artifacts.java import is_java_binary_name

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
