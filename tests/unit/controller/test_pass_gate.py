"""How many reconcile passes run at once: the setting plus one per probe slot."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from taskhandler_operator.controller.runtime import pass_gate_size
from taskhandler_operator.settings import Settings


def test_the_gate_adds_one_place_per_probe_slot() -> None:
    assert pass_gate_size(Settings()) == 16 + 4
    assert pass_gate_size(Settings(max_concurrent_passes=2, probe_parallelism=8)) == 10


@pytest.mark.parametrize("bad", [0, 1025])
def test_the_setting_is_bounded(bad: int) -> None:
    with pytest.raises(ValidationError, match="max_concurrent_passes"):
        Settings(max_concurrent_passes=bad)
