"""The probe's options as a pydantic model: the definition :class:`.launch.ProbeConfig` defers to.

A probe pod builds :class:`~.launch.ProbeConfig` without pydantic when every option already has
its type and is within its bounds (the command line's usual case); otherwise this model
validates them, so a bad option is refused with pydantic's errors (``invalid probe options``)
and a value to coerce is coerced exactly as before.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.limits import MAX_FRAME_SIZE, MAX_REQUEST_DAG_IDS
from taskhandler_operator.protocol.plain import dag_id_problem
from taskhandler_operator.protocol.relay import RelayLimits

__all__ = ["ProbeOptions"]


class ProbeOptions(BaseModel):
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
            problem = dag_id_problem(dag_id)
            if problem is not None:
                raise ValueError(problem)
        return tuple(sorted(set(value)))
