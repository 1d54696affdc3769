"""The real node's watchdog: if the process that started the node dies without stopping it,
kill the node's pods and shims, restore the host (``teardown``) and remove the node's folder.

The kubelet, containerd and the scheduler die with their parent by ``setpriv --pdeathsig``;
the shims and the containers they run do not (the shim daemonizes). The watchdog runs in its own
session and reads a pipe whose only writer is the parent: ``release`` means the parent stopped
the node itself; end of file without it means the parent is gone, however it ended.

Run as ``python -m taskhandler_devenv.kubecluster.realnode.watchdog <record.json>``.
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

from .teardown import Record, teardown

RELEASE = "release"


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    record_path = Path(argv[0])
    for line in sys.stdin:
        if line.strip() == RELEASE:
            return 0
    if record_path.is_file():
        record = Record.read(record_path)
        teardown(record)
        # The node's folder holds containerd's content and snapshots: the largest part.
        shutil.rmtree(record.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
