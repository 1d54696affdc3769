"""VersityGW (Apache-2.0) as a local S3 server on loopback, for the source tests and the
sources benchmark (development only).

``versitygw_binary`` is the binary ``hack/build-versitygw.sh`` builds from its Go module and
caches; ``start_s3_server`` runs it over a POSIX folder on a free port with an access log of
every S3 call; :class:`S3Server` puts objects and counts the calls that reached it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from taskhandler_devenv.git_server import SourceServerError, wait_for_port
from taskhandler_devenv.kubecluster.bins import REPO_ROOT
from taskhandler_devenv.kubecluster.procs import ManagedProcess, free_port

VERSITYGW_SCRIPT: Final = REPO_ROOT / "hack" / "build-versitygw.sh"
#: The root credentials the server is started with; the secret is a distinctive string so the
#: tests can prove it appears nowhere.
S3_ACCESS_KEY: Final = "thopaccess"
S3_SECRET_KEY: Final = "thop-planted-s3-secret-4e1b7c"  # noqa: S105 - planted, test only


def versitygw_binary() -> Path:
    """The cached binary built by hack/build-versitygw.sh (built now when THOP_BUILD_S3=1)."""
    path = Path(
        subprocess.run(
            ["bash", str(VERSITYGW_SCRIPT), "--path"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    complete = path.parent / ".complete"
    if not (os.access(path, os.X_OK) and complete.exists()):
        if os.environ.get("THOP_BUILD_S3") == "1":
            subprocess.run(["bash", str(VERSITYGW_SCRIPT)], check=True, timeout=1800)
        else:
            raise SourceServerError(
                f"VersityGW is not built ({path}): run `make versitygw` "
                "(or set THOP_BUILD_S3=1 to build it from the tests)"
            )
    return path


@dataclass
class S3Server:
    endpoint: str
    data: Path
    access_log: Path
    proc: ManagedProcess
    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY

    @property
    def credentials(self) -> dict[str, bytes]:
        return {
            "accessKeyID": self.access_key.encode(),
            "secretAccessKey": self.secret_key.encode(),
        }

    def calls(self, operation: str, bucket: str) -> int:
        """How many times ``operation`` (e.g. GetObject) reached the server for ``bucket``."""
        count = 0
        with contextlib.suppress(FileNotFoundError):
            for line in self.access_log.read_text().splitlines():
                fields = line.split()
                if len(fields) > 7 and fields[1] == bucket and fields[7] == f"s3_{operation}":
                    count += 1
        return count

    def client(self) -> Any:
        from aiobotocore.session import get_session
        from botocore.config import Config

        return get_session().create_client(
            "s3",
            region_name="us-east-1",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}),
        )

    def put(self, bucket: str, objects: Mapping[str, bytes | None], create: bool = False) -> None:
        """Create the bucket (``create``) and put (or, for None, delete) objects."""

        async def go() -> None:
            async with self.client() as client:
                if create:
                    await client.create_bucket(Bucket=bucket)
                for key, body in objects.items():
                    if body is None:
                        await client.delete_object(Bucket=bucket, Key=key)
                    else:
                        await client.put_object(Bucket=bucket, Key=key, Body=body)

        asyncio.run(go())

    def wait_for_log(self, bucket: str) -> None:
        """Wait until every earlier request on ``bucket`` is in the access log (written
        asynchronously): send a marker request and wait for it to appear after them."""
        before = self.calls("HeadBucket", bucket)

        async def marker() -> None:
            async with self.client() as client:
                await client.head_bucket(Bucket=bucket)

        asyncio.run(marker())
        deadline = time.monotonic() + 30
        while self.calls("HeadBucket", bucket) <= before:
            if time.monotonic() > deadline:
                raise AssertionError(f"VersityGW's access log did not record {bucket}'s marker")
            time.sleep(0.02)


def start_s3_server(folder: Path, attempts: int = 3) -> S3Server:
    """VersityGW serving ``folder/data`` on a free loopback port, its access log in ``folder``;
    a port taken between choosing and binding it is retried (``attempts`` times)."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    log = folder / "access.log"
    binary = versitygw_binary()
    env = {**os.environ, "ROOT_ACCESS_KEY": S3_ACCESS_KEY, "ROOT_SECRET_KEY": S3_SECRET_KEY}
    for _ in range(attempts):
        port = free_port()
        proc = ManagedProcess(
            "versitygw",
            [
                str(binary),
                "--port", f"127.0.0.1:{port}",
                "--access-log", str(log),
                "--quiet",
                "posix", str(data),
            ],
            folder / "versitygw.log",
            env=env,
        )  # fmt: skip
        try:
            wait_for_port(port, proc)
        except SourceServerError:
            continue
        return S3Server(f"http://127.0.0.1:{port}", data, log, proc)
    raise SourceServerError(
        f"VersityGW did not start: {(folder / 'versitygw.log').read_text()[-500:]}"
    )
