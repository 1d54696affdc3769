"""``file_lock``: an exclusive ``flock`` on a file, polled so that waiting stays cancellable.

The lock file may be removed by whoever holds it (a pruned git mirror takes its lock file
along): a waiter that then gets the lock on the removed file would share the name with the
next process that creates it, so the lock is only held once the file at ``path`` is still the
one locked; otherwise it is opened again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

__all__ = ["LOCK_POLL_SECONDS", "file_lock", "try_file_lock"]

LOCK_POLL_SECONDS = 0.05


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _still_there(fd: int, path: Path) -> bool:
    try:
        current = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino)


@contextlib.asynccontextmanager
async def file_lock(path: Path) -> AsyncIterator[None]:
    """An exclusive ``flock`` on ``path``, polled so that waiting stays cancellable."""
    while True:
        fd = await asyncio.to_thread(_open, path)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(LOCK_POLL_SECONDS)
            if not _still_there(fd, path):
                continue  # removed by the previous holder: lock the new file
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return
        finally:
            os.close(fd)


@contextlib.contextmanager
def try_file_lock(path: Path) -> Iterator[bool]:
    """The lock on ``path`` if it is free now (True), else False at once (blocking call)."""
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield _still_there(fd, path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
