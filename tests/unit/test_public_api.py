"""The modules other programs import declare their public API, and it holds what it says."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC_MODULES = (
    "taskhandler_operator.scheduler",
    "taskhandler_operator.artifacts",
    "taskhandler_operator.protocol",
)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_names_exist_and_none_is_private(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported, f"{name}.__all__ is empty"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    assert [n for n in exported if n.startswith("_")] == []
    for attribute in exported:
        assert getattr(module, attribute) is not None, f"{name}.{attribute}"
    # `from module import *` gives exactly the declared names.
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(exported)


@pytest.mark.parametrize(
    "name", ["taskhandler_operator.artifacts", "taskhandler_operator.protocol"]
)
def test_an_unknown_name_is_an_attribute_error(name: str) -> None:
    module = importlib.import_module(name)
    with pytest.raises(AttributeError, match=r"has no attribute 'nothing_here'"):
        _ = module.nothing_here


def test_the_scheduler_imports_neither_kopf_nor_kubernetes() -> None:
    code = (
        "import sys, taskhandler_operator.scheduler as s; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kopf', 'kubernetes')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_packages_load_their_modules_lazily() -> None:
    """The CLI imports these packages to list commands: that must not load every reader."""
    code = (
        "import sys, taskhandler_operator.artifacts, taskhandler_operator.protocol; "
        "print(sorted(m for m in sys.modules if m.startswith('taskhandler_operator.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "['taskhandler_operator.artifacts', 'taskhandler_operator.protocol']"
    )
