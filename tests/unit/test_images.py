"""images/*/Dockerfile cannot be built here; this checks what can be checked without Docker:
every file they COPY from the build context exists, they are multi-stage with no build tools
installed in the final stage, the final USER is numeric and not root, they carry the OCI labels,
and their entry point is the command the chart and the probe Jobs run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from taskhandler_operator.kube.probe_job import fetch_command, probe_command
from tests.unit.kube.test_probe_job import request

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))
TEMPLATES = REPO / "charts" / "taskhandler-operator" / "templates"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|npm|maven|gradle|javac|-dev)\b")
OCI_LABELS = ("title", "description", "version", "licenses", "source")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def test_there_is_an_operator_image_and_a_java_and_a_node_runtime() -> None:
    assert [p.parent.name for p in DOCKERFILES] == ["operator", "probe-java", "probe-node"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_copied_file_exists(dockerfile: Path) -> None:
    copies = [args for word, args in instructions(dockerfile) if word in ("COPY", "ADD")]
    local = [shlex.split(a) for a in copies if "--from=" not in a]
    assert local, "the image installs the probe driver from this repository"
    missing = [src for *sources, _dest in local for src in sources if not (REPO / src).exists()]
    assert missing == []


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_final_stage_is_non_root_labelled_and_free_of_build_tools(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    assert sum(word == "FROM" for word, _ in steps) >= 2, "multi-stage"
    final = final_stage(steps)
    users = [args for word, args in final if word == "USER"]
    assert users, "the final stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    runs = " ".join(args for word, args in final if word == "RUN")
    assert not BUILD_TOOLS.search(runs), runs
    labels = " ".join(args for word, args in final if word == "LABEL")
    for key in OCI_LABELS:
        assert f"org.opencontainers.image.{key}=" in labels, key


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_entry_point_is_the_command_the_chart_and_the_probe_jobs_run(dockerfile: Path) -> None:
    entry = [json.loads(a) for w, a in final_stage(instructions(dockerfile)) if w == "ENTRYPOINT"]
    assert entry == [["taskhandler-operator"]]
    assert probe_command(request())[0] == fetch_command(request())[0] == entry[0][0]
    for template in ("deployment.yaml", "migration-job.yaml"):
        text = (TEMPLATES / template).read_text(encoding="utf-8")
        commands = re.findall(r"^\s*command: (\[.*\])$", text, flags=re.M)
        assert [yaml.safe_load(c) for c in commands] == [entry[0]], template


def test_the_charts_default_images_are_these_images() -> None:
    values = yaml.safe_load((REPO / "charts" / "taskhandler-operator" / "values.yaml").read_text())
    assert values["image"]["repository"].endswith("/taskhandler-operator")
    images = values["probe"]["runtimeImages"]
    assert images["java"]["repository"].rsplit("/", 1)[1] == "taskhandler-probe-java"
    assert images["typescript"]["repository"].rsplit("/", 1)[1] == "taskhandler-probe-node"
    # The tag follows the chart's appVersion, as the operator image's does.
    assert images["java"]["tag"] == images["typescript"]["tag"] == values["image"]["tag"] == ""
