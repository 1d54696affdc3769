"""images/Dockerfile cannot be built here (no Docker engine, no registry); this checks what can
be checked without them, on the parsed file:

* it has one target per image the chart runs (operator, probe-java, probe-node), all on one base
  stage, the operator the default target; `make kind-images` builds exactly those targets with
  VERSION from the chart's appVersion and REVISION from git, tagged as the chart's values name;
* every external base image is pinned by tag and digest, the runtime base is Debian trixie,
  and every `COPY --from` names a stage;
* each image's effective labels carry title, description, version and revision from the build
  arguments, the licence of LICENSE and the chart's source; its last USER is numeric and not
  root; no build tool is installed in a runtime image;
* the third-party packages come only from the hash-locked images/requirements.txt;
* every file copied from the build context exists and .dockerignore lets it through;
* the entry point is the command the chart and the probe Jobs run;
* hadolint (pinned in the dev extra) finds nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from taskhandler_operator.kube.probe_job import fetch_command, probe_command
from tests.unit.kube.test_probe_job import request
from tests.unit.test_release_metadata import license_spdx_id

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "images" / "Dockerfile"
LOCK = "images/requirements.txt"
# The build backend for the build stage (the base image's own setuptools is too old).
BUILD_LOCK = "images/build-requirements.txt"
CHART = REPO / "charts" / "taskhandler-operator"
TEMPLATES = CHART / "templates"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
# The images the chart runs, by the Dockerfile target that builds each.
TARGETS = {
    "operator": VALUES["image"]["repository"],
    "probe-java": VALUES["probe"]["runtimeImages"]["java"]["repository"],
    "probe-node": VALUES["probe"]["runtimeImages"]["typescript"]["repository"],
}
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|npm|maven|gradle|javac|-dev)\b")
PINNED = re.compile(r"^[a-z0-9][\w./-]*:[\w.-]+@sha256:[0-9a-f]{64}$")
OCI = "org.opencontainers.image."


@dataclass
class Stage:
    source: str  # the FROM reference, build arguments substituted
    name: str
    steps: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Dockerfile:
    directives: dict[str, str]
    args: dict[str, str]  # the global ARGs (before the first FROM) and their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def chain(self, target: str) -> list[Stage]:
        """The stages an image is built on, its external base first and `target` last."""
        names = [s.name for s in self.stages]
        stage = self.stage(target)
        chain = [stage]
        while stage.source in names:
            stage = self.stage(stage.source)
            chain.insert(0, stage)
        return chain

    def steps(self, target: str) -> list[tuple[str, str]]:
        return [step for stage in self.chain(target) for step in stage.steps]


def parse(text: str) -> Dockerfile:
    """A Dockerfile's parser directives, global ARGs and stages: continuation lines joined,
    comments dropped (also inside a continued instruction, as docker does)."""
    directives: dict[str, str] = {}
    lines = text.splitlines()
    for line in lines:
        directive = re.fullmatch(r"#\s*(syntax|escape|check)\s*=\s*(.*)", line.strip())
        if not directive:
            break
        directives[directive[1]] = directive[2].strip()
    instructions: list[str] = []
    buffer = ""
    for raw in lines:
        line = raw.strip()
        if line.startswith("#") or (not line and not buffer):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        instructions.append(buffer + line)
        buffer = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions:
        word, _, rest = instruction.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            tokens = [t for t in rest.split() if not t.startswith("--")]
            source = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m[1]], tokens[0])
            name = tokens[2] if len(tokens) == 3 and tokens[1].upper() == "AS" else ""
            stages.append(Stage(source, name))
        elif not stages:
            assert word == "ARG", f"only ARG may come before the first FROM: {instruction}"
            key, _, default = rest.partition("=")
            args[key] = default.strip('"')
        else:
            stages[-1].steps.append((word, rest))
    return Dockerfile(directives, args, stages)


def labels(steps: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for word, args in steps:
        if word == "LABEL":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                out[key] = value
    return out


def shell_commands(steps: list[tuple[str, str]]) -> list[list[str]]:
    """Every RUN's commands, split on && and tokenised."""
    return [shlex.split(cmd) for w, a in steps if w == "RUN" for cmd in a.split("&&")]


IMAGE = parse(DOCKERFILE.read_text(encoding="utf-8"))


def kind_images_commands() -> list[list[str]]:
    """What `make kind-images` runs, with the Makefile's defaults (not a parent make's flags or
    an IMAGE_TAG/REVISION from the environment)."""
    overrides = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "IMAGE_TAG", "IMAGE_REPO", "REVISION"}
    env = {k: v for k, v in os.environ.items() if k not in overrides}
    done = subprocess.run(
        ["make", "-n", "kind-images"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    return [shlex.split(line) for line in done.stdout.splitlines() if line.startswith("docker ")]


def test_one_dockerfile_builds_every_image_on_one_base_stage() -> None:
    external = {s.source for s in IMAGE.stages} - {s.name for s in IMAGE.stages}
    for target in TARGETS:
        chain = IMAGE.chain(target)
        assert [s.name for s in chain[:2]] == ["base", target], target
        assert chain[0].source == IMAGE.args["PYTHON_IMAGE"]
    # `docker build images/Dockerfile` without --target builds the operator.
    assert IMAGE.stages[-1].name == "operator"
    # The venv every image runs is the one shared build stage's.
    assert ("COPY", "--from=build /opt/taskhandler-operator /opt/taskhandler-operator") in (
        IMAGE.stage("base").steps
    )
    assert external == {IMAGE.args[a] for a in ("PYTHON_IMAGE", "JRE_IMAGE", "NODE_IMAGE")}


def test_make_kind_images_builds_each_target_with_the_charts_version_and_the_revision() -> None:
    revision = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    built = {}
    for argv in kind_images_commands():
        assert argv[:4] == ["docker", "build", "-f", "images/Dockerfile"], argv
        options = list(itertools.pairwise(argv))
        build_args = dict(v.split("=", 1) for k, v in options if k == "--build-arg")
        assert build_args == {"VERSION": CHART_META["appVersion"], "REVISION": revision}
        [target] = [v for k, v in options if k == "--target"]
        [tag] = [v for k, v in options if k == "-t"]
        built[target] = tag
    assert built == {t: f"{repo}:{CHART_META['appVersion']}" for t, repo in TARGETS.items()}


def test_every_external_base_image_is_pinned_by_tag_and_digest() -> None:
    stage_names = {s.name for s in IMAGE.stages}
    external = [s.source for s in IMAGE.stages if s.source not in stage_names]
    assert external
    for source in external:
        assert PINNED.match(source), f"{source}: pin it as <image>:<tag>@sha256:<digest>"
    # A `# syntax=` frontend is an image too.
    syntax = IMAGE.directives.get("syntax")
    assert syntax is None or PINNED.match(syntax), syntax
    # COPY --from=<image> would pull an unpinned image past the FROM lines.
    for stage in IMAGE.stages:
        for word, args in stage.steps:
            for ref in re.findall(r"--from=(\S+)", args) if word == "COPY" else []:
                assert ref in stage_names, f"COPY --from={ref} in stage {stage.name}"


def test_the_runtime_base_is_debian_trixie() -> None:
    # Every image runs on the Python base; the node binary comes from a trixie build as well
    # (the JRE comes from Temurin's own build: it carries its libraries).
    assert re.match(r"python:3\.\d+-slim-trixie@", IMAGE.args["PYTHON_IMAGE"])
    assert re.match(r"node:\d+-trixie-slim@", IMAGE.args["NODE_IMAGE"])
    for target in TARGETS:
        assert IMAGE.chain(target)[0].source == IMAGE.args["PYTHON_IMAGE"]


@pytest.mark.parametrize("target", TARGETS)
def test_labels_carry_version_revision_licence_and_source(target: str) -> None:
    steps = IMAGE.steps(target)
    found = labels(steps)
    assert found[OCI + "title"] == TARGETS[target].rsplit("/", 1)[1]
    assert found[OCI + "description"]
    assert found[OCI + "version"] == "${VERSION}"
    assert found[OCI + "revision"] == "${REVISION}"
    assert found[OCI + "licenses"] == license_spdx_id()
    assert found[OCI + "source"] == CHART_META["home"] == CHART_META["sources"][0]
    # ARG is scoped to its stage: the stage that writes the labels declares both arguments
    # before it does.
    final = IMAGE.stage(target).steps
    label_at = max(i for i, (w, a) in enumerate(final) if w == "LABEL" and "${VERSION}" in a)
    declared = {a.split("=")[0] for w, a in final[:label_at] if w == "ARG"}
    assert {"VERSION", "REVISION"} <= declared


@pytest.mark.parametrize("target", TARGETS)
def test_runs_as_a_numeric_non_root_user_without_build_tools(target: str) -> None:
    steps = IMAGE.steps(target)
    users = [args for word, args in steps if word == "USER"]
    assert users, "the image sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert not BUILD_TOOLS.search(runs), runs


def test_third_party_packages_come_only_from_the_hash_locked_requirements() -> None:
    build = IMAGE.stage("build").steps
    copied = [shlex.split(a) for w, a in build if w == "COPY" and a.split()[0] == LOCK]
    assert len(copied) == 1, f"the build stage copies {LOCK}"
    lock_in_image = copied[0][-1]
    pip = [c for s in IMAGE.stages for c in shell_commands(s.steps) if c[0].endswith("pip")]
    installs = [cmd for cmd in pip if cmd[1] == "install"]
    from_lock = [c for c in installs if "-r" in c and c[c.index("-r") + 1] == lock_in_image]
    assert len(from_lock) == 1, installs
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(from_lock[0])
    build_lock = [
        shlex.split(a)[-1] for w, a in build if w == "COPY" and a.split()[0] == BUILD_LOCK
    ]
    assert len(build_lock) == 1, f"the build stage copies {BUILD_LOCK}"
    from_build_lock = [c for c in installs if "-r" in c and c[c.index("-r") + 1] == build_lock[0]]
    assert len(from_build_lock) == 1, installs
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(from_build_lock[0])
    # Anything else pip installs or builds comes from the build context, never an index.
    for cmd in installs:
        assert cmd in from_lock + from_build_lock or {"--no-deps", "--no-index"} <= set(cmd), cmd
    for cmd in pip:
        if cmd[1] == "wheel":
            assert {"--no-deps", "--no-build-isolation"} <= set(cmd), cmd
    assert ["check"] in [c[1:] for c in pip], "pip check after installing"


def test_the_build_stage_builds_with_a_setuptools_the_project_accepts() -> None:
    """The official python:3.11 image carries setuptools 65.5.1 (docker-library/python), which
    cannot read pyproject.toml's SPDX `license` string; the build stage installs the hash-locked
    build backend first, at a version [build-system] accepts and the test extra also pins."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    text = (REPO / BUILD_LOCK).read_text(encoding="utf-8")
    pins = dict(
        line.split()[0].split("==", 1)
        for line in text.splitlines()
        if line and not line[0].isspace() and not line.startswith("#")
    )
    assert text.count("--hash=sha256:") >= len(pins)
    assert set(pins) == {"setuptools"}
    wanted = [Requirement(r) for r in pyproject["build-system"]["requires"]]
    setuptools = next(r for r in wanted if r.name == "setuptools")
    assert setuptools.specifier.contains(pins["setuptools"]), (setuptools, pins)
    test_extra = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["test"]]
    assert f"=={pins['setuptools']}" in {
        str(r.specifier) for r in test_extra if r.name == "setuptools"
    }
    commands = shell_commands(IMAGE.stage("build").steps)
    installs_backend = next(
        i for i, c in enumerate(commands) if BUILD_LOCK.split("/")[1] in " ".join(c)
    )
    builds = next(i for i, c in enumerate(commands) if c[:2] == ["pip", "wheel"])
    assert installs_backend < builds


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as docker reads it: `*` and `?` stay within one path element,
    `**` spans any number of them."""
    out = ""
    for piece in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
            piece, re.escape(piece)
        )
    return re.compile(out)


def dockerignore_allows(path: str, patterns: list[str]) -> bool:
    """Whether `path` is in the build context: the last matching pattern wins, `!` lets a path
    back in, and a pattern that matches a folder matches everything under it."""
    parts = path.split("/")
    folders_and_path = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    allowed = True
    for pattern in patterns:
        regex = dockerignore_regex(pattern.removeprefix("!"))
        if any(regex.fullmatch(p) for p in folders_and_path):
            allowed = pattern.startswith("!")
    return allowed


def test_every_copied_file_exists_and_is_in_the_build_context() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [
        shlex.split(args)
        for stage in IMAGE.stages
        for word, args in stage.steps
        if word in ("COPY", "ADD") and "--from=" not in args
    ]
    sources = [src for *srcs, _dest in copies for src in srcs]
    assert "operator" in sources and LOCK in sources and BUILD_LOCK in sources
    tracked = subprocess.run(
        ["git", "ls-files", *sources], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for src in sources:
        assert (REPO / src).exists(), src
        files = [f for f in tracked if f == src or f.startswith(src + "/")]
        assert files, f"{src} is not tracked"
        left_out = [f for f in files if not dockerignore_allows(f, patterns)]
        assert left_out == [], f".dockerignore leaves out {left_out}"
    # The context is only that: no virtualenv, tests or caches are sent to the builder.
    for path in (".venv/bin/python", "tests/conftest.py", "operator/x/__pycache__/y.pyc"):
        assert not dockerignore_allows(path, patterns), path


def test_dockerignore_matching_follows_docker() -> None:
    patterns = ["*", "!operator", "**/__pycache__", "!keep/**/__pycache__"]
    assert dockerignore_allows("operator/a/b.py", patterns)
    assert not dockerignore_allows("operator/a/__pycache__/b.pyc", patterns)
    assert not dockerignore_allows("README.md", patterns)
    assert not dockerignore_allows("keep/x/__pycache__/y", patterns[:3])
    assert dockerignore_allows("keep/x/__pycache__/y", patterns)
    assert not dockerignore_allows("operatorx", patterns)


@pytest.mark.parametrize("target", TARGETS)
def test_entry_point_is_the_command_the_chart_and_the_probe_jobs_run(target: str) -> None:
    entry = [json.loads(a) for w, a in IMAGE.steps(target) if w == "ENTRYPOINT"]
    assert entry[-1] == ["taskhandler-operator"]
    assert probe_command(request())[0] == fetch_command(request())[0] == entry[-1][0]
    for template in ("_deployment.tpl", "migration-job.yaml"):  # every shard's Deployment
        text = (TEMPLATES / template).read_text(encoding="utf-8")
        commands = re.findall(r"^\s*command: (\[.*\])$", text, flags=re.M)
        assert [yaml.safe_load(c) for c in commands] == [entry[-1]], template


def test_the_charts_default_images_are_these_images() -> None:
    assert TARGETS["operator"].endswith("/taskhandler-operator")
    assert TARGETS["probe-java"].rsplit("/", 1)[1] == "taskhandler-probe-java"
    assert TARGETS["probe-node"].rsplit("/", 1)[1] == "taskhandler-probe-node"
    images = VALUES["probe"]["runtimeImages"]
    # Go probes run in the operator image (Go artifacts are static executables).
    assert images["go"]["repository"] == ""
    # The tag follows the chart's appVersion, as the operator image's does.
    assert images["java"]["tag"] == images["typescript"]["tag"] == VALUES["image"]["tag"] == ""


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint comes with the dev extra (make venv)"
    done = subprocess.run(
        [str(hadolint), "--no-color", "--config", str(REPO / ".hadolint.yaml"), str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The settings hold: an unlicensed label and an unpinned apt install are findings.
    bad = DOCKERFILE.read_text(encoding="utf-8").replace('licenses="Apache-2.0"', 'licenses="x"')
    done = subprocess.run(
        [str(hadolint), "--no-color", "--config", str(REPO / ".hadolint.yaml"), "-"],
        input=bad + "RUN apt-get install -y --no-install-recommends curl\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "DL3054" in done.stdout and "DL3008" in done.stdout, done.stdout


def test_the_python_code_is_precompiled_without_source_checks() -> None:
    # A probe pod runs a fresh interpreter with PYTHONDONTWRITEBYTECODE=1: without bytecode in
    # the image it compiled every module it imported, on every probe (docs/operations.md).
    def compiles(stage: str) -> list[list[str]]:
        commands = shell_commands(IMAGE.stage(stage).steps)
        return [c for c in commands if c[1:3] == ["-m", "compileall"]]

    [venv] = compiles("build")
    [stdlib] = compiles("base")
    for cmd in (venv, stdlib):
        assert cmd[cmd.index("--invalidation-mode") + 1] == "unchecked-hash", cmd
    assert venv[-1] == "/opt/taskhandler-operator/lib"
    assert "stdlib" in stdlib[-1]
    # After everything is installed into the venv (the last pip command of the build stage).
    build = [c for c in shell_commands(IMAGE.stage("build").steps) if c]
    assert build[-1] == venv
    env = " ".join(a for w, a in IMAGE.stage("base").steps if w == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
