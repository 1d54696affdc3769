"""``taskhandler-operator diff`` and ``rollback`` on the real PostgreSQL and apiserver.

The history is written by the operator's own write path (three passes: a publication, a move,
a removal held by ``NoRemoval``); the bundle's name is read from a real TaskHandlerBundle;
``rollback`` sets its annotation through the apiserver (docs/operator.md, "Publication under
control").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.kubecluster.procs import free_port
from taskhandler_devenv.manifests import bundle_manifest
from taskhandler_devenv.serialized_dags import dag_document, stub_task
from taskhandler_operator.cli import main
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.migrate import upgrade
from taskhandler_operator.kube import names
from taskhandler_operator.publication.policy import PublishControl, PublishPolicy
from tests.integration.db.helpers import add_dags, artifact, declaration, reconcile

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.usefixtures("thb_crd")]

NAME = "orders"
BUNDLE = "java"


@pytest.fixture
def db_url(pg_url: str) -> str:
    upgrade(pg_url)
    return pg_url


def seed(url: str, write: Callable[[AsyncEngine], Awaitable[None]]) -> None:
    """Run ``write`` on an engine of its own (the CLI runs its own event loop, so the tests
    are synchronous)."""

    async def main_() -> None:
        engine = create_engine(url)
        try:
            await write(engine)
        finally:
            await engine.dispose()

    asyncio.run(main_())


@pytest.fixture
def bundle(kube_cluster: KubeCluster, kube_namespace: str) -> str:
    """A TaskHandlerBundle named ``orders`` serving the bundle name ``java``."""
    manifest = bundle_manifest(
        kube_namespace,
        NAME,
        language="java",
        source={"http": {"url": "http://example.invalid/java.tar.gz", "sha256": "0" * 64}},
        queues=[BUNDLE],
        bundle_name=BUNDLE,
    )
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    return f"{kube_namespace}/{NAME}"


def etl(*tasks: str) -> dict[str, Any]:
    return dag_document("etl", [stub_task(t, queue=BUNDLE) for t in tasks])


def jars(*, load_in: str = "etl.jar", size: int = 100) -> list[Any]:
    handlers: dict[str, dict[str, list[Any]]] = {"etl.jar": {"etl": []}, "more.jar": {"etl": []}}
    handlers["etl.jar"]["etl"].append(declaration("extract"))
    handlers[load_in]["etl"].append(declaration("load"))
    return [
        artifact(BUNDLE, "etl.jar", handlers["etl.jar"], size=size),
        artifact(BUNDLE, "more.jar", handlers["more.jar"]),
    ]


def control(revision: str, policy: PublishPolicy = PublishPolicy.AUTOMATIC) -> PublishControl:
    return PublishControl(revision=revision, operator="operator-0", policy=policy)


async def history(engine: AsyncEngine) -> None:
    """r1 publishes extract and load (etl.jar); r2 moves load to more.jar; under NoRemoval,
    r3 (the Dag drops load) is held."""
    await add_dags(engine, etl("extract", "load"))
    await reconcile(engine, BUNDLE, [BUNDLE], jars(), publish=control("r1-0123456789"))
    await reconcile(
        engine, BUNDLE, [BUNDLE], jars(load_in="more.jar"), publish=control("r2-abcdefabcd")
    )
    await add_dags(engine, etl("extract"))
    _, held = await reconcile(
        engine,
        BUNDLE,
        [BUNDLE],
        jars(load_in="more.jar"),
        publish=control("r3-feedfeedfe", PublishPolicy.NO_REMOVAL),
    )
    assert held.publication is not None and held.publication.held


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(kube_cluster: KubeCluster, db_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """The CLI in this process with the cluster's kubeconfig and the database URL."""

    def call(*argv: str, url: str | None = db_url) -> tuple[int, str, str]:
        capsys.readouterr()
        extra = ["--kubeconfig", str(kube_cluster.kubeconfig)]
        if url is not None:
            extra += ["--url", url]
        code = main([*argv, *extra])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def bundle_meta(kube_cluster: KubeCluster, target: str) -> dict[str, Any]:
    namespace, name = target.split("/")
    found = json.loads(
        kube_cluster.kubectl(
            "get", "thb", name, "-n", namespace, "-o", "json", "--show-managed-fields"
        ).stdout
    )
    meta: dict[str, Any] = found["metadata"]
    return meta


def test_diff_prints_the_pending_change_else_a_publication(
    db_url: str, bundle: str, run: Run
) -> None:
    namespace = bundle.split("/")[0]
    # Nothing recorded yet: refused, one line.
    code, out, err = run("diff", bundle)
    assert (code, out) == (1, "")
    assert err == "error: bundle 'java' has no pending change and no publication recorded\n"

    seed(db_url, history)
    code, out, err = run("diff", bundle)
    assert code == 0, err
    lines = out.splitlines()
    assert (
        lines[0]
        == f"# pending change of {bundle} (bundle java): revision r3-feedfeedfe, "
        + (lines[0].split(", ", 1)[1])
    )
    assert lines[0].split(", ", 1)[1].startswith("held since 20")
    assert lines[1].startswith("# held: publish policy NoRemoval holds") and "etl/load" in lines[1]
    assert lines[2] == "# 1 removed"
    assert lines[3:] == ["removed etl/load: was more.jar @digest-more.jar-100"]

    code, out, _ = run("diff", bundle, "--json")
    document = json.loads(out)
    assert code == 0
    assert {k: document[k] for k in ("namespace", "name", "bundle_name", "state", "revision")} == {
        "namespace": namespace,
        "name": NAME,
        "bundle_name": BUNDLE,
        "state": "pending",
        "revision": "r3-feedfeedfe",
    }
    assert document["counts"] == {"added": 0, "removed": 1, "moved": 0, "changed": 0}
    [change] = document["changes"]
    assert (change["kind"], change["dag_id"], change["task_id"]) == ("removed", "etl", "load")
    assert change["before"]["artifact_path"] == "more.jar" and change["after"] is None

    # A publication by (a unique part of) its revision; the whole change set, one a line.
    code, out, _ = run("diff", bundle, "--revision", "r2-abcdefabcd")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("# publication ") and "revision r2-abcdefabcd, published" in out
    assert lines[-1] == (
        "moved etl/load: etl.jar @digest-etl.jar-100 -> more.jar @digest-more.jar-100"
    )
    code, out, _ = run("diff", bundle, "--revision", "0123456789", "--json")
    document = json.loads(out)
    assert (code, document["state"], document["revision"]) == (0, "published", "r1-0123456789")
    assert sorted((c["kind"], c["task_id"]) for c in document["changes"]) == [
        ("added", "extract"),
        ("added", "load"),
    ]
    # Without the apiserver: the bundle name given.
    code, out, _ = run("diff", "any/name", "--bundle-name", BUNDLE)
    assert code == 0 and out.splitlines()[-1].startswith("removed etl/load")

    code, out, err = run("diff", bundle, "--revision", "r9")
    assert (code, out) == (1, "")
    assert err.startswith("error: revision 'r9' is not in the publication history of bundle 'java'")
    assert "r2-abcdefabcd" in err and err.count("\n") == 1


def test_diff_and_rollback_refuse_clearly(
    db_url: str, bundle: str, run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    namespace = bundle.split("/")[0]
    for command in ("diff", "rollback"):
        code, _, err = run(command, f"{namespace}/missing")
        assert (code, err) == (1, f"error: no TaskHandlerBundle {namespace}/missing\n")
        code, _, err = run(command, "not-a-target")
        assert code == 2 and "is not NAMESPACE/NAME" in err
        monkeypatch.delenv("THOP_DATABASE_URL", raising=False)
        monkeypatch.delenv("THOP_DATABASE_URL_FILE", raising=False)
        code, _, err = run(command, bundle, url=None)
        assert code == 2 and err.startswith("error: no database URL"), err
        # A server that is not there: retrying may help.
        closed = f"postgresql+psycopg://airflow@127.0.0.1:{free_port()}/airflow"
        code, _, err = run(command, bundle, url=closed)
        assert code == 75 and err.startswith("error: database unavailable"), err
        # A kubeconfig that is not there.
        code = main([command, bundle, "--url", db_url, "--kubeconfig", str(tmp_path / "none")])
        assert code == 2


def test_rollback_sets_the_annotation_to_an_earlier_publication(
    db_url: str, bundle: str, run: Run, kube_cluster: KubeCluster
) -> None:
    code, _, err = run("rollback", bundle)
    assert code == 1 and "has no publication recorded to roll back to" in err
    seed(db_url, history)

    # Not in the history: refused, nothing set.
    code, out, err = run("rollback", bundle, "--to", "r3-feedfeedfe")  # held, not published
    assert (code, out) == (1, "")
    assert "is not in the publication history of bundle 'java'" in err
    assert names.ANNOTATION_ROLLBACK_TO not in (
        bundle_meta(kube_cluster, bundle).get("annotations") or {}
    )

    # By default: the newest publication of another revision than the current one (r2).
    code, out, err = run("rollback", bundle)
    assert code == 0, err
    assert f"{names.ANNOTATION_ROLLBACK_TO}=r1-0123456789 set" in out
    meta = bundle_meta(kube_cluster, bundle)
    assert meta["annotations"][names.ANNOTATION_ROLLBACK_TO] == "r1-0123456789"
    # Who asked, for the operator's history (managedFields).
    managers = {
        entry["manager"]
        for entry in meta["managedFields"]
        if names.ANNOTATION_ROLLBACK_TO
        in json.dumps(entry.get("fieldsV1", {}).get("f:metadata", {}))
    }
    assert managers == {"taskhandler-operator-cli"}

    # --to by a unique part of the revision.
    code, out, _ = run("rollback", bundle, "--to", "abcdefabcd")
    assert code == 0 and "=r2-abcdefabcd set" in out
    assert bundle_meta(kube_cluster, bundle)["annotations"][names.ANNOTATION_ROLLBACK_TO] == (
        "r2-abcdefabcd"
    )


def test_rollback_refuses_a_revision_whose_answers_are_gone(
    db_url: str, bundle: str, run: Run, kube_cluster: KubeCluster
) -> None:
    async def write(engine: AsyncEngine) -> None:
        await add_dags(engine, etl("extract", "load"))
        await reconcile(engine, BUNDLE, [BUNDLE], jars(), publish=control("r1-0123456789"))
        # etl.jar changes content: the answer r1 published is no longer stored.
        await reconcile(engine, BUNDLE, [BUNDLE], jars(size=101), publish=control("r2-abcdefabcd"))

    seed(db_url, write)
    code, out, err = run("rollback", bundle)
    assert (code, out) == (1, "")
    assert err == (
        "error: cannot roll back bundle 'java' to revision r1-0123456789: the answers of its "
        "artifacts are no longer known (etl.jar is gone or changed since)\n"
    )
    assert names.ANNOTATION_ROLLBACK_TO not in (
        bundle_meta(kube_cluster, bundle).get("annotations") or {}
    )
