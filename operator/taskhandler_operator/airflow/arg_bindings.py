"""The ``_arg_bindings`` of a serialized stub task (ADR-0007), parsed tolerantly.

Airflow writes one entry per declared parameter of the stub, in declaration order:

* ``{"name", "kind": "xcom", "task_id", ["value_schema"]}``: the upstream task's return value;
* ``{"name", "kind": "literal", "value", ["value_schema"], ["from_default": true]}``: a JSON
  value, ``from_default`` when it came from the signature's default rather than the call.

``value_schema`` is omitted (never null) when the annotation has no schema; a null is read as
omitted. Anything else that does not fit becomes a message in
:attr:`ParsedArgBindings.problems` instead of an exception, so one odd Dag never stops the
inventory of the others.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    TypeAdapter,
    ValidationError,
)

from taskhandler_operator.records import ArgValueSchema


class _ArgBindingBase(BaseModel):
    # Newer Airflow may add keys; they do not change what we compare.
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    value_schema: ArgValueSchema | None = None


class XComArgBinding(_ArgBindingBase):
    kind: Literal["xcom"]
    task_id: str


class LiteralArgBinding(_ArgBindingBase):
    kind: Literal["literal"]
    value: JsonValue
    from_default: StrictBool = False


ArgBinding = Annotated[XComArgBinding | LiteralArgBinding, Field(discriminator="kind")]

_ARG_BINDING: TypeAdapter[XComArgBinding | LiteralArgBinding] = TypeAdapter(ArgBinding)

KNOWN_KINDS: frozenset[str] = frozenset({"xcom", "literal"})


class ParsedArgBindings(BaseModel):
    """``bindings`` is None for an argless stub (no ``_arg_bindings`` at all)."""

    model_config = ConfigDict(frozen=True)

    bindings: tuple[XComArgBinding | LiteralArgBinding, ...] | None
    problems: tuple[str, ...] = ()


def is_passed(binding: XComArgBinding | LiteralArgBinding) -> bool:
    """Whether the Dag author passed the argument (a defaulted literal was not passed)."""
    return not (isinstance(binding, LiteralArgBinding) and binding.from_default)


def parse_arg_bindings(raw: Any) -> ParsedArgBindings:
    """Read a task's ``_arg_bindings`` value; odd shapes become problems, not exceptions."""
    if raw is None:
        return ParsedArgBindings(bindings=None)
    if not isinstance(raw, list):
        return ParsedArgBindings(
            bindings=None,
            problems=(f"_arg_bindings is {describe_json_type(raw)}, expected a list of arguments",),
        )
    bindings: list[XComArgBinding | LiteralArgBinding] = []
    problems: list[str] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        parsed = _parse_entry(index, entry)
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        if parsed.name in seen:
            problems.append(f"_arg_bindings names argument {parsed.name!r} twice")
            continue
        seen.add(parsed.name)
        bindings.append(parsed)
    if problems:
        return ParsedArgBindings(bindings=None, problems=tuple(problems))
    return ParsedArgBindings(bindings=tuple(bindings))


def _parse_entry(index: int, entry: Any) -> XComArgBinding | LiteralArgBinding | str:
    where = f"_arg_bindings[{index}]"
    if not isinstance(entry, dict):
        return f"{where} is {describe_json_type(entry)}, expected an object"
    name = entry.get("name")
    if isinstance(name, str):
        where = f"{where} ({name!r})"
    kind = entry.get("kind")
    if kind not in KNOWN_KINDS:
        shown = repr(kind) if isinstance(kind, str) else describe_json_type(kind)
        return f"{where} has unknown binding kind {shown}, expected 'xcom' or 'literal'"
    if kind == "literal" and "value" not in entry:
        return f"{where} is a literal without a value"
    try:
        return _ARG_BINDING.validate_python(entry)
    except ValidationError as exc:
        return f"{where}: {_first_error(exc)}"


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first.get("loc", ()) if part not in KNOWN_KINDS)
    message = str(first.get("msg", "invalid"))
    return f"{loc}: {message}" if loc else message


def describe_json_type(value: Any) -> str:
    """The JSON name of a value's type, with an article, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
