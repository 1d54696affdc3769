"""Fuzz every artifact reader: the Go bundle, the JAR and the .min.mjs readers, listing and
verification, at the fuzzing budget.

Reuses the unit tests' structure-aware strategies (tests/unit/artifacts/test_reader_properties.py)
and mutations of valid seeds (test_hostile_inputs.py), and adds byte-level mutations of the
structured inputs themselves, which reach checks neither reaches alone. The contract is the unit
tests' (``check_contract``): a candidate, a skip or a listing problem; a verified artifact or
``ArtifactVerificationError`` with a one-line, bounded message; nothing else escapes; the Python
heap peaks under 48 MiB per example.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskhandler_operator.artifacts.models import Language
from tests.fuzz.budget import FUZZ
from tests.unit.artifacts.test_hostile_inputs import _mutations
from tests.unit.artifacts.test_reader_properties import (
    check_contract,
    go_bundles,
    jars,
    ts_bundles,
    zip64_jars,
)

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(3600)]

_EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4)


def _flip(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for offset, value in edits:
        if out:
            out[offset % len(out)] = value
    return bytes(out)


def mutated(structured: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """A structured input, or the same with a few bytes overwritten."""
    return st.one_of(structured, st.builds(_flip, structured, _EDITS))


INPUTS: dict[Language, st.SearchStrategy[bytes]] = {
    Language.GO: st.one_of(mutated(go_bundles()), _mutations(Language.GO)),
    Language.JAVA: st.one_of(mutated(jars()), zip64_jars, _mutations(Language.JAVA)),
    Language.TYPESCRIPT: st.one_of(mutated(ts_bundles()), _mutations(Language.TYPESCRIPT)),
}


@pytest.mark.parametrize("language", list(Language))
@FUZZ
@given(data=st.data())
def test_reader_contract(language: Language, data: st.DataObject) -> None:
    check_contract(language, data.draw(st.one_of(INPUTS[language], st.binary(max_size=16384))))
