"""images/Dockerfile built for real (BuildKit, local base images; docs/images.md "Images
without a registry") and each image checked from its OCI archive and run with runc as a
restricted pod runs it: UID 65532, read-only root, no capabilities, /tmp an emptyDir.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from taskhandler_devenv.images import app_version, build_images, image_ref
from taskhandler_devenv.images import build as build_module
from taskhandler_devenv.images.oci import IMAGE_NAME_ANNOTATION, Archive, read_archive
from taskhandler_devenv.images.runc import Bind, RunResult, image_env, run
from taskhandler_devenv.runtimes import LANGUAGES
from taskhandler_operator.protocol.summary import ProbeSummary
from tests.fixtures.runtimes_plugin import RuntimeFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = "opt/taskhandler-operator/bin"
CMD = {"operator": ["run"], "probe-java": ["probe", "--help"], "probe-node": ["probe", "--help"]}


def _revision() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_each_archive_is_named_for_containerd(built_images: dict[str, Path]) -> None:
    version = app_version()
    assert sorted(built_images) == sorted(
        image_ref(t, version) for t in ("operator", "probe-java", "probe-node")
    )
    for ref, path in built_images.items():
        assert read_archive(path).index_annotations[IMAGE_NAME_ANNOTATION] == ref


@pytest.mark.parametrize("target", ["operator", "probe-java", "probe-node"])
def test_config_user_command_and_labels(archives: dict[str, Archive], target: str) -> None:
    config = archives[target].runtime
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["taskhandler-operator"]
    assert config["Cmd"] == CMD[target]
    assert config["WorkingDir"] == "/tmp"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == app_version()
    assert labels["org.opencontainers.image.revision"] == _revision()
    title = "taskhandler-operator" if target == "operator" else f"taskhandler-{target}"
    assert labels["org.opencontainers.image.title"] == title
    assert any(e.startswith("PATH=/opt/taskhandler-operator/bin:") for e in config["Env"])


@pytest.mark.parametrize("target", ["operator", "probe-java", "probe-node"])
def test_file_system(archives: dict[str, Archive], target: str) -> None:
    files = archives[target].files()
    assert f"{VENV_BIN}/taskhandler-operator" in files
    # No package installer left, neither the system's nor the venv's.
    installers = sorted(
        p
        for p in files
        if p.endswith(("/bin/pip", "/bin/pip3"))
        or p.endswith(("-packages/pip", "-packages/setuptools", "-packages/wheel"))
    )
    assert installers == []
    assert ("usr/bin/git" in files) == (target == "operator")
    assert ("opt/java/openjdk/bin/java" in files) == (target == "probe-java")
    assert ("usr/local/bin/node" in files) == (target == "probe-node")


def _run(runc: Path, rootfs: Path, archive: Archive, tmp_path: Path, argv: list[str]) -> RunResult:
    return run(
        runc,
        rootfs,
        tmp_path,
        argv,
        env=image_env(archive),
        cwd=archive.runtime.get("WorkingDir", "/"),
    )


@pytest.mark.parametrize(
    ("target", "argv", "expect"),
    [
        ("operator", ["taskhandler-operator", "--version"], "taskhandler-operator "),
        ("operator", ["git", "--version"], "git version"),
        ("probe-java", ["taskhandler-operator", "probe", "--help"], "usage"),
        ("probe-java", ["java", "-version"], "version"),
        ("probe-node", ["taskhandler-operator", "probe", "--help"], "usage"),
        ("probe-node", ["node", "--version"], "v"),
    ],
)
def test_runs_as_non_root_on_a_read_only_root(
    runc: Path,
    rootfs: dict[str, Path],
    archives: dict[str, Archive],
    tmp_path: Path,
    target: str,
    argv: list[str],
    expect: str,
) -> None:
    done = _run(runc, rootfs[target], archives[target], tmp_path, argv)
    assert done.returncode == 0, done.stderr
    assert expect in (done.stdout + done.stderr)


def test_the_root_is_read_only_and_the_user_unprivileged(
    runc: Path, rootfs: dict[str, Path], archives: dict[str, Archive], tmp_path: Path
) -> None:
    script = (
        "import os, pathlib\n"
        "print(os.getuid(), os.getgid())\n"
        "try:\n    pathlib.Path('/opt/x').write_text('x')\n"
        "except OSError as e:\n    print('ro', e.errno)\n"
        "pathlib.Path('/tmp/x').write_text('x'); print('tmp ok')\n"
    )
    done = _run(runc, rootfs["operator"], archives["operator"], tmp_path, ["python", "-c", script])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["65532 65532", "ro 30", "tmp ok"]


def test_git_clones_as_a_user_without_a_passwd_entry(
    runc: Path, rootfs: dict[str, Path], archives: dict[str, Archive], tmp_path: Path
) -> None:
    """The operator's git sources clone as UID 65532, which no /etc/passwd names."""
    script = (
        "set -e; git init -q /tmp/src; cd /tmp/src; "
        "git -c user.name=t -c user.email=t@example.invalid commit -q --allow-empty -m one; "
        "git clone -q /tmp/src /tmp/dst; git -C /tmp/dst rev-parse HEAD"
    )
    done = _run(runc, rootfs["operator"], archives["operator"], tmp_path, ["sh", "-c", script])
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) == 40


# The image each language's probe container runs (Go artifacts are static: the operator image).
PROBE_IMAGE = {"go": "operator", "java": "probe-java", "typescript": "probe-node"}


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_probe_runs_in_its_image_as_the_probe_job_runs_it(
    runc: Path,
    rootfs: dict[str, Path],
    archives: dict[str, Archive],
    runtime_factory: RuntimeFactory,
    tmp_path: Path,
    language: str,
) -> None:
    """The probe Job's container: the bundle read-only at /bundle, /tmp an emptyDir with HOME
    and TMPDIR there, the termination log bind-mounted, UID 65532, read-only root, no caps."""
    artifact = runtime_factory(language)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(artifact, bundle / artifact.name)
    (bundle / artifact.name).chmod(0o755)
    bundle.chmod(0o755)
    log = tmp_path / "termination-log"
    log.touch()
    log.chmod(0o666)
    target = PROBE_IMAGE[language]
    argv = ["taskhandler-operator", "probe", f"/bundle/{artifact.name}", "--language", language,
            "--bundle-root", "/bundle", "--bundle-name", "demo", "--timeout", "60"]  # fmt: skip
    done = run(
        runc,
        rootfs[target],
        tmp_path,
        argv,
        env=image_env(archives[target], {"HOME": "/tmp", "TMPDIR": "/tmp"}),
        cwd="/tmp",
        binds=[Bind(bundle, "/bundle"), Bind(log, "/dev/termination-log", read_only=False)],
        timeout=120,
    )
    summary = ProbeSummary.model_validate_json(log.read_text(encoding="utf-8"))
    assert (done.returncode, summary.status, summary.error) == (0, "ok", None), done.stderr
    assert (summary.dag_count, summary.handler_count) == (2, 5)


def test_an_unchanged_tree_is_not_rebuilt(
    built_images: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {ref: path.stat().st_mtime_ns for ref, path in built_images.items()}

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("an unchanged tree started a build")

    monkeypatch.setattr(build_module, "_build", no_build)
    start = time.monotonic()
    again = build_images()
    assert time.monotonic() - start < 2.0
    assert again == built_images
    assert {ref: path.stat().st_mtime_ns for ref, path in again.items()} == before


def test_a_changed_source_changes_the_key(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for name in ("images", "operator/taskhandler_operator"):
        (tree / name).mkdir(parents=True)
    (tree / "images" / "Dockerfile").write_text("FROM x\n")
    module = tree / "operator" / "taskhandler_operator" / "m.py"
    module.write_text("a = 1\n")
    (tree / "pyproject.toml").write_text("[project]\n")
    args = {"version": "0.1.0", "revision": "r", "base_keys": {"python": "k"}, "buildkit_key": "b"}
    first = build_module.input_key(tree, **args)  # type: ignore[arg-type]
    (tree / "operator" / "taskhandler_operator" / "__pycache__").mkdir()
    (tree / "operator" / "taskhandler_operator" / "__pycache__" / "m.cpython-311.pyc").write_bytes(
        b"x"
    )
    assert build_module.input_key(tree, **args) == first  # type: ignore[arg-type]
    module.write_text("a = 2\n")
    assert build_module.input_key(tree, **args) != first  # type: ignore[arg-type]
    module.write_text("a = 1\n")
    assert build_module.input_key(tree, **{**args, "base_keys": {"python": "k2"}}) != first  # type: ignore[arg-type]


def test_a_dockerfile_without_the_base_args_is_a_named_error(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG PYTHON_IMAGE=python:3.11\nFROM ${PYTHON_IMAGE}\n")
    with pytest.raises(build_module.ImageBuildError, match="JRE_IMAGE"):
        build_module.base_args(dockerfile)
    assert set(build_module.base_args(REPO / "images" / "Dockerfile")) == {
        "PYTHON_IMAGE",
        "JRE_IMAGE",
        "NODE_IMAGE",
    }
