"""``taskhandler-operator db claims list|release`` on the real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from taskhandler_operator.cli import main
from taskhandler_operator.db.claims import read_claim
from taskhandler_operator.db.engine import create_engine
from taskhandler_operator.db.write_models import BundlePass
from taskhandler_operator.db.writer import write_pass
from taskhandler_operator.records import ArtifactRecord
from tests.integration.db.helpers import PROBED_AT, artifact, declaration, owner

pytestmark = pytest.mark.integration

CLUSTER_B = owner("java", namespace="team-b", cluster_id="old-cluster")


def seed(url: str) -> None:
    """A name claimed from another cluster id, and unowned rows of a name nobody claims."""

    async def write() -> None:
        engine = create_engine(url)
        try:
            for name, claimant in (("java", CLUSTER_B), ("legacy", owner("legacy"))):
                found = artifact(name, f"{name}.jar", {"etl": [declaration("extract")]})
                await write_pass(
                    engine,
                    BundlePass(
                        bundle_name=name,
                        owner=claimant,
                        queues=(name,),
                        artifacts=(ArtifactRecord(artifact=found, probed_at=PROBED_AT),),
                    ),
                )
            async with engine.begin() as conn:  # as if written before claims existed
                await conn.execute(
                    sa.text("DELETE FROM thop_bundle_claim WHERE bundle_name = 'legacy'")
                )
        finally:
            await engine.dispose()

    asyncio.run(write())


def claim_of(url: str, name: str) -> object:
    async def read() -> object:
        engine = create_engine(url)
        try:
            return await read_claim(engine, name)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_list_shows_holders_and_unowned_names(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(db_url)
    assert main(["db", "claims", "list", "--url", db_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "BUNDLE",
        "HOLDER",
        "UID",
        "CLAIMED",
        "QUEUES",
        "ARTIFACTS",
        "BINDINGS",
    ]
    java = lines[1].split()
    assert java[:3] == ["java", "old-cluster/team-b/java", CLUSTER_B.uid]
    assert java[4:] == ["java", "1", "0"]
    assert lines[2].split() == ["legacy", "(unowned)", "-", "-", "-", "1", "0"]


def test_release_frees_a_claim_from_another_cluster(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(db_url)
    # The wrong uid: refused, one line, nothing changed.
    assert main(["db", "claims", "release", "java", "--uid", "x", "--url", db_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: bundle name 'java' is held by TaskHandlerBundle team-b/java")
    assert err.count("\n") == 1
    assert claim_of(db_url, "java") is not None

    # The command the conflict's condition prints.
    argv = ["db", "claims", "release", "java", "--uid", CLUSTER_B.uid, "--url", db_url]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "released bundle name 'java' from TaskHandlerBundle team-b/java" in out
    assert claim_of(db_url, "java") is None
    assert main(argv) == 1  # released already: the uid no longer holds it

    # Nothing to release without a claim, unless the rows go too.
    capsys.readouterr()
    assert main(["db", "claims", "release", "legacy", "--url", db_url]) == 1
    assert main(["db", "claims", "release", "legacy", "--delete-rows", "--url", db_url]) == 0
    assert "deleted 0 bindings, 1 artifacts" in capsys.readouterr().out
    assert main(["db", "claims", "list", "--url", db_url]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "BUNDLE",
        "java",
    ]
