"""Message models of the task-handler probe protocol and the binding records.

Design B (the shape Airflow's code implements) is primary; Design-A variants are accepted on
input so that older runtimes and older supervisors still interoperate:

* ``TaskHandlerParseRequest`` may carry ``dag_ids`` (Design A); a runtime ignores it.
* ``TaskHandlerParam`` may carry ``required`` (Design A); it is accepted and kept.
* ``TaskHandlerDeclaration.binding`` may be a mode newer or older SDKs emit
  (``named_or_whole``, ``named_open``); :attr:`TaskHandlerDeclaration.mode` folds those into
  ``named`` and reports anything else as unknown, so validation can name it.
* Results typed ``SDKTaskHandlerParsingResult`` (Design A) are read as
  ``TaskHandlerParsingResult``.

Bodies are plain JSON types: they travel as msgpack maps with a ``type`` discriminator.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# A JSON Schema fragment describing one argument's value; compared only at the top level.
ArgValueSchema = dict[str, Any]

BindingMode = Literal["positional", "named"]

# Modes emitted by SDK branches that mean "match by name" for validation purposes.
NAMED_MODE_VARIANTS: frozenset[str] = frozenset({"named", "named_or_whole", "named_open"})

MAX_REL_PATH = 2000
MAX_CACHE_DIGEST = 128


class _Wire(BaseModel):
    """Base for wire models: unknown keys are ignored, as the protocol requires."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class TaskHandlerParam(_Wire):
    name: str | None = None
    value_schema: ArgValueSchema | None = None
    exact_name: bool = False
    # Design A only; Design B expresses optionality through the stub's defaults.
    required: bool | None = None


class TaskHandlerDeclaration(_Wire):
    task_id: str
    # Design A had no binding field: every declaration was positional.
    binding: str = "positional"
    params: list[TaskHandlerParam] | None = None

    @property
    def mode(self) -> BindingMode | None:
        """The validation mode, or ``None`` when the SDK sent a mode we do not know."""
        if self.binding == "positional":
            return "positional"
        if self.binding in NAMED_MODE_VARIANTS:
            return "named"
        return None


TaskHandlers = dict[str, list[TaskHandlerDeclaration]]


class TaskHandlerParseRequest(_Wire):
    """Sent by the supervisor as the id-0 first frame of a probe."""

    type: Literal["TaskHandlerParseRequest"] = "TaskHandlerParseRequest"
    file: str
    bundle_path: str
    bundle_name: str
    # Design A: the Dags the supervisor wanted. Design-B supervisors never send it.
    dag_ids: list[str] | None = None

    def to_body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class TaskHandlerParsingResult(_Wire):
    """The runtime's answer: every registered handler, keyed by dag_id."""

    type: Literal["TaskHandlerParsingResult", "SDKTaskHandlerParsingResult"] = (
        "TaskHandlerParsingResult"
    )
    fileloc: str = ""
    # Never null: a runtime with no handlers answers {}.
    task_handlers: TaskHandlers
    import_errors: dict[str, str] | None = None
    warnings: list[Any] | None = None

    @field_validator("task_handlers", mode="before")
    @classmethod
    def _storable(cls, value: object) -> object:
        # PostgreSQL's jsonb cannot hold NUL; refusing it here makes such an answer an invalid
        # probe result of this one artifact instead of a write failure for its whole bundle.
        if contains_nul(value):
            raise ValueError("task handler declarations contain a NUL character")
        return value

    @field_validator("task_handlers")
    @classmethod
    def _unique_task_ids(cls, value: TaskHandlers) -> TaskHandlers:
        for dag_id, declarations in value.items():
            seen: set[str] = set()
            for declaration in declarations:
                if declaration.task_id in seen:
                    raise ValueError(
                        f"Dag {dag_id!r} declares task handler {declaration.task_id!r} twice"
                    )
                seen.add(declaration.task_id)
        return value

    @property
    def handler_count(self) -> int:
        return sum(len(declarations) for declarations in self.task_handlers.values())


def contains_nul(value: object) -> bool:
    """Whether a JSON value holds a NUL character in any key or string.

    Iterative, because the nesting depth of a runtime's answer is the runtime's choice.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending += item.keys()
            pending += item.values()
        elif isinstance(item, list | tuple):
            pending += item
    return False


class ErrorResponse(_Wire):
    type: Literal["ErrorResponse"] = "ErrorResponse"
    error: str = "generic_error"
    detail: dict[str, Any] | None = None


class OKResponse(_Wire):
    type: Literal["OKResponse"] = "OKResponse"
    ok: bool = True


# Requests a runtime may send to its supervisor (Airflow's ToManager union, minus the results).
# A probe has no Airflow client, so the driver answers each of them with an ErrorResponse; the
# models keep their payload loosely so that any SDK's spelling validates.
RUNTIME_REQUEST_TYPES: frozenset[str] = frozenset(
    {
        "GetConnection",
        "GetVariable",
        "GetVariableKeys",
        "PutVariable",
        "DeleteVariable",
        "GetTaskStates",
        "GetTICount",
        "GetPrevSuccessfulDagRun",
        "GetPreviousDagRun",
        "GetPreviousTI",
        "GetXCom",
        "GetXComCount",
        "GetXComSequenceItem",
        "GetXComSequenceSlice",
        "MaskSecret",
    }
)


class RuntimeRequest(BaseModel):
    """One of the ``Get*``/``Put*`` requests; fields vary per type and are kept as sent."""

    model_config = ConfigDict(extra="allow")

    type: str

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in RUNTIME_REQUEST_TYPES:
            raise ValueError(f"unknown request type {value!r}")
        return value


RESULT_TYPES: frozenset[str] = frozenset(
    {"TaskHandlerParsingResult", "SDKTaskHandlerParsingResult"}
)


class InvalidMessage(ValueError):
    """A frame body that does not validate as any message a runtime may send."""


def parse_runtime_message(body: object) -> TaskHandlerParsingResult | RuntimeRequest:
    """Validate a body received from a runtime (Airflow's ``ToManager`` for a probe)."""
    if not isinstance(body, dict):
        raise InvalidMessage(f"message body is {type(body).__name__}, expected a map")
    kind = body.get("type")
    if not isinstance(kind, str):
        raise InvalidMessage("message body has no string 'type'")
    try:
        if kind in RESULT_TYPES:
            return TaskHandlerParsingResult.model_validate(body)
        if kind in RUNTIME_REQUEST_TYPES:
            return RuntimeRequest.model_validate(body)
    except ValidationError as exc:
        raise InvalidMessage(f"{kind} does not validate: {_first_error(exc)}") from exc
    raise InvalidMessage(f"unexpected message type {kind!r}")


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    loc = ".".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first.get('msg', '')}{more}"


# --- records shared with the database and the scheduler --------------------------------------


class TaskHandlerArtifact(_Wire):
    """A probed artifact: what Airflow calls a known artifact once it is stored."""

    bundle_name: str
    relative_fileloc: Annotated[str, Field(max_length=MAX_REL_PATH)]
    size_bytes: Annotated[int, Field(ge=0)]
    cache_digest: Annotated[str, Field(max_length=MAX_CACHE_DIGEST)] | None = None
    task_handlers: TaskHandlers = Field(default_factory=dict)


class TaskHandlerBinding(_Wire):
    dag_id: str
    task_id: str
    artifact_bundle_name: str
    artifact_rel_path: Annotated[str, Field(max_length=MAX_REL_PATH)]


class BundleInfo(_Wire):
    name: str
    version: str | None = None


class TaskHandlerArtifactRef(_Wire):
    """What the scheduler puts on ``ExecuteTask``: the artifact to run for a stub task.

    ``bundle_info`` null means "the task's own Dag bundle"; ``rel_path`` is a POSIX path in it.
    """

    bundle_info: BundleInfo | None = None
    rel_path: str


# Design-A names, so code and payloads written against the older ADR read naturally.
SDKTaskHandlerRef = TaskHandlerArtifactRef
KnownSDKTaskHandlerArtifact = TaskHandlerArtifact
