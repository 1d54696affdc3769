"""Annotations that put Kubernetes-only schema keywords into the pydantic models' JSON schema.

The CRD is generated from the same models the operator validates with (``kube/crd.py``). Most
of the schema comes from pydantic; these markers add what JSON Schema has no word for:

* :class:`Cel` — an ``x-kubernetes-validations`` rule with the message the apiserver returns;
* :class:`ListType` — ``x-kubernetes-list-type`` (``set``: duplicates refused; ``map``: merged
  by key, as ``metav1.Condition`` lists are);
* :data:`Quantity` — a resource quantity, ``x-kubernetes-int-or-string``.

A constraint that a CEL rule states is checked in Python by a validator function rather than a
pydantic ``pattern``/``ge``, so the CRD carries one rule with one clear message instead of a
second, terser OpenAPI error for the same mistake. The integration tests feed the same invalid
specs to both sides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, GetJsonSchemaHandler, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = [
    "QUANTITY_PATTERN",
    "Cel",
    "ListType",
    "Quantity",
    "cel_string",
    "check_pattern",
    "quantity_value",
]

VALIDATIONS = "x-kubernetes-validations"


@dataclass(frozen=True)
class Cel:
    """A CEL validation rule on the annotated node; ``message`` is what ``kubectl`` prints."""

    rule: str
    message: str

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = dict(handler(core_schema))
        schema[VALIDATIONS] = [
            *schema.get(VALIDATIONS, []),
            {"rule": self.rule, "message": self.message},
        ]
        return schema


@dataclass(frozen=True)
class ListType:
    """``x-kubernetes-list-type`` (and, for ``map``, the key fields) of the annotated list."""

    kind: Literal["atomic", "set", "map"]
    keys: tuple[str, ...] = ()

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = dict(handler(core_schema))
        schema["x-kubernetes-list-type"] = self.kind
        if self.keys:
            schema["x-kubernetes-list-map-keys"] = list(self.keys)
        return schema


def cel_string(text: str) -> str:
    """``text`` as a single-quoted CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_pattern(pattern: str, message: str) -> AfterValidator:
    """A validator refusing strings that do not match ``pattern`` (the CEL rule's twin)."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


# apimachinery's resource.Quantity grammar, without a sign: requests and limits are never negative.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)
QUANTITY_MESSAGE = "must be a Kubernetes quantity such as 500m, 256Mi, 1Gi or 2"


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and len(value) > MAX_QUANTITY_CHARS:
        raise ValueError(f"a quantity has at most {MAX_QUANTITY_CHARS} characters")
    if isinstance(value, int):
        # An integer quantity is an int64 in the API; a larger one overflowed float() when
        # requests were compared with limits (found by tests/fuzz).
        if value < 0 or value > MAX_QUANTITY_INT:
            raise ValueError(QUANTITY_MESSAGE)
        return value
    if not _QUANTITY.fullmatch(value):
        raise ValueError(QUANTITY_MESSAGE)
    return value


MAX_QUANTITY_CHARS = 64
MAX_QUANTITY_INT = 2**63 - 1

_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}
_SPLIT = re.compile(r"([0-9.]+(?:[eE][+-]?[0-9.]+)?)([A-Za-z]*)")


def quantity_value(value: int | str) -> float:
    """A quantity as a number, precise enough to compare a request with a limit."""
    if isinstance(value, int):
        return float(value)
    match = _SPLIT.fullmatch(value)
    if not match or (match.group(2) and match.group(2) not in _SUFFIX):
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX.get(match.group(2), 1)


_QUANTITY_SCHEMA: dict[str, Any] = {
    "x-kubernetes-int-or-string": True,
    # Bounds the CEL rule's cost estimate (the apiserver refuses an unbounded one).
    "maxLength": MAX_QUANTITY_CHARS,
    VALIDATIONS: [
        {
            "rule": f"type(self) == int ? self >= 0 : self.matches({cel_string(QUANTITY_PATTERN)})",
            "message": QUANTITY_MESSAGE,
        }
    ],
}

Quantity = Annotated[
    int | str, AfterValidator(_check_quantity), WithJsonSchema(_QUANTITY_SCHEMA, mode="validation")
]
"""A resource quantity (``500m``, ``256Mi``, ``2``), as ``core/v1`` ResourceRequirements has."""
