"""The runtime's process tree: who owns a connection, and ending every process it started.

Everything here is blocking (it reads ``/proc`` through psutil); the driver calls it through
``asyncio.to_thread``.

The runtime is started in a new session (``start_new_session=True``), so its pid is also its
session id and process-group id. A descendant can still leave the group (``setpgid``) or the
session (``setsid``); once its parent exits it is re-parented away and no longer looks like a
descendant. :class:`ProcessTracker` therefore remembers every process it has seen in the tree
(pid plus start time, so a reused pid is never mistaken for it) and, at the end, also sweeps the
system for members of the runtime's session or group.

That is not enough on its own: a grandchild that calls ``setsid`` and whose parent exits before
the next snapshot leaves the session, the group and the tree at once. So the driver also makes
itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, :class:`ChildSubreaper`): every
orphan of the runtime's tree is then re-parented to the driver instead of to init, and
:class:`ProcessTracker` counts as the runtime's every descendant of the driver that was not there
before the runtime started. The driver reaps what it adopts. A process that survives SIGKILL
(uninterruptible sleep, or another user's setuid program) is reported, never ignored.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = [
    "ChildSubreaper",
    "ProcessTracker",
    "canonical_host",
    "children",
    "find_connection_owner",
    "reap_orphans",
]

Address = tuple[str, int]


def canonical_host(host: str) -> str:
    """``127.0.0.1`` for the IPv4-mapped and IPv4-compatible IPv6 spellings of it, else as is."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        # IPv4-compatible (deprecated ::a.b.c.d): the high 96 bits are zero.
        packed = address.packed
        if packed[:12] == bytes(12) and int(address) > 1:
            return str(ipaddress.IPv4Address(packed[12:]))
    return str(address)


def _decode_proc_address(text: str) -> Address:
    """``0100007F:1F90`` (or the 32-hex-digit IPv6 form) from ``/proc/net/tcp*``."""
    host_hex, port_hex = text.split(":")
    raw = bytes.fromhex(host_hex)
    # The kernel prints each 32-bit word in host (little-endian) byte order.
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    host = str(ipaddress.ip_address(packed))
    return canonical_host(host), int(port_hex, 16)


def _socket_inode(pid: int, peer: Address, local: Address) -> int | None:
    """Inode of the TCP socket whose local end is ``peer`` and remote end ``local``."""
    inode = _diag_inode(peer, local)
    if inode is None:
        inode = _proc_socket_inode(pid, peer, local)
    return inode


# sock_diag (linux/inet_diag.h): ask the kernel for one socket by its exact 4-tuple.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_HEADER = struct.Struct("=IHHII")
_DIAG_REQUEST = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_NO_COOKIE = 0xFFFFFFFF
# struct inet_diag_msg: 4 bytes of family/state/timer/retrans, a 48-byte socket id, then
# expires, rqueue, wqueue, uid and inode (u32 each).
_DIAG_INODE_OFFSET = _NLMSG_HEADER.size + 4 + 48 + 16


def _diag_inode(peer: Address, local: Address) -> int | None:
    """One exact lookup per address family, instead of a walk of the whole TCP table.

    A runtime on a dual-stack IPv6 socket (the JVM's default) connects from
    ``::ffff:127.0.0.1``; that socket is found under AF_INET6 with mapped addresses.
    """
    try:
        source = ipaddress.ip_address(peer[0])
        destination = ipaddress.ip_address(local[0])
    except ValueError:
        return None
    lookups: list[tuple[int, bytes, bytes]] = []
    if isinstance(source, ipaddress.IPv4Address) and isinstance(destination, ipaddress.IPv4Address):
        lookups.append((socket.AF_INET, source.packed + bytes(12), destination.packed + bytes(12)))
        mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + source.packed)
        mapped_destination = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + destination.packed)
        lookups.append((socket.AF_INET6, mapped.packed, mapped_destination.packed))
    else:
        lookups.append((socket.AF_INET6, source.packed, destination.packed))
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)
            for family, src, dst in lookups:
                inode = _diag_query(diag, family, peer[1], local[1], src, dst)
                if inode is not None:
                    return inode
    except OSError:
        return None  # no sock_diag here (or not allowed): the caller reads /proc instead
    return None


def _diag_query(
    diag: socket.socket, family: int, sport: int, dport: int, src: bytes, dst: bytes
) -> int | None:
    socket_id = struct.pack("!HH16s16s", sport, dport, src, dst) + struct.pack(
        "=III", 0, _NO_COOKIE, _NO_COOKIE
    )
    request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + socket_id
    header = _NLMSG_HEADER.pack(
        _NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0
    )
    diag.sendto(header + request, (0, 0))
    reply = diag.recv(65536)
    if len(reply) < _DIAG_INODE_OFFSET + 4:
        return None  # an NLMSG_ERROR (ENOENT: no such socket in this family)
    (message_type,) = struct.unpack_from("=H", reply, 4)
    if message_type != _SOCK_DIAG_BY_FAMILY:
        return None
    (inode,) = struct.unpack_from("=I", reply, _DIAG_INODE_OFFSET)
    return int(inode)


def _proc_socket_inode(pid: int, peer: Address, local: Address) -> int | None:
    """The same lookup through ``/proc/<pid>/net/tcp*`` (a walk of the whole table)."""
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as rows:
                next(rows, None)  # header
                for row in rows:
                    fields = row.split()
                    if len(fields) < 10:
                        continue
                    if (
                        _decode_proc_address(fields[1]) == peer
                        and _decode_proc_address(fields[2]) == local
                    ):
                        return int(fields[9])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
    return None


def _holds_socket(pid: int, inode: int) -> bool:
    target = Path(f"socket:[{inode}]")
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    for fd in fds:
        try:
            if fd.readlink() == target:
                return True
        except OSError:
            continue
    return False


def find_connection_owner(root_pid: int, peer: Address, local: Address) -> int | None:
    """The pid in ``root_pid``'s tree holding the other end of a connection we accepted.

    ``peer`` is the accepted socket's remote address (the runtime's local end) and ``local``
    its local address (our listener). The root is checked first: it is nearly always the one
    that connected, and checking it alone avoids walking the whole process table.
    """
    peer = (canonical_host(peer[0]), peer[1])
    local = (canonical_host(local[0]), local[1])
    inode = _socket_inode(root_pid, peer, local)
    if inode is None:
        return None
    if _holds_socket(root_pid, inode):
        return root_pid
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for child in children:
        if _holds_socket(child.pid, inode):
            return child.pid
    return None


# linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def _prctl(option: int, arg: object) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux, or no prctl in this libc
        return False


def get_child_subreaper() -> bool | None:
    """Whether this process adopts orphaned descendants; None when the kernel cannot say."""
    value = ctypes.c_int(0)
    if not _prctl(PR_GET_CHILD_SUBREAPER, ctypes.pointer(value)):
        return None
    return bool(value.value)


class ChildSubreaper:
    """While active, orphans of this process's descendants are re-parented to it, not to init.

    The flag belongs to the whole process; it is restored on exit only if it was off before,
    so a process that already was a subreaper (or PID 1, which adopts everything anyway) stays
    one.
    """

    def __init__(self) -> None:
        self.active = False
        self._restore = False

    def __enter__(self) -> ChildSubreaper:
        before = get_child_subreaper()
        if before:
            self.active = True
        elif before is not None and _prctl(PR_SET_CHILD_SUBREAPER, 1):
            self.active = self._restore = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._restore:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
        self.active = self._restore = False


@dataclass(frozen=True, slots=True)
class _Seen:
    pid: int
    create_time: float


def _identity(process: psutil.Process) -> _Seen | None:
    try:
        return _Seen(process.pid, process.create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def children(pid: int, *, recursive: bool = False) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=recursive))
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


class ProcessTracker:
    """Remembers the processes of one runtime so that none outlives the probe.

    ``adopter`` is the pid that spawned the runtime (the driver) and ``baseline`` the
    identities of the adopter's children from before the runtime started: with the adopter a
    child subreaper, any *other* child of it (and everything under that child) is the
    runtime's or was re-parented from the runtime's tree. Processes under a baseline child
    are not (a database server the tests started forks backends at any time). Without an
    adopter only the tree, the session and the group are searched.
    """

    def __init__(
        self,
        root_pid: int,
        *,
        adopter: int | None = None,
        baseline: frozenset[tuple[int, float]] = frozenset(),
    ) -> None:
        self.root_pid = root_pid
        self.adopter = adopter
        self.baseline = baseline
        self._seen: dict[int, _Seen] = {}
        self.snapshot()

    @staticmethod
    def baseline_of(adopter: int) -> frozenset[tuple[int, float]]:
        """Identities of ``adopter``'s children now (call it before spawning the runtime)."""
        found = (_identity(p) for p in children(adopter))
        return frozenset((seen.pid, seen.create_time) for seen in found if seen is not None)

    @property
    def seen_pids(self) -> list[int]:
        return sorted(self._seen)

    def _adopted(self) -> list[psutil.Process]:
        if self.adopter is None:
            return []
        adopted = []
        for child in children(self.adopter):
            seen = _identity(child)
            if seen is not None and (seen.pid, seen.create_time) not in self.baseline:
                adopted += [child, *children(child.pid, recursive=True)]
        return adopted

    def snapshot(self) -> None:
        """Record the root, its current descendants, and anything the adopter adopted."""
        try:
            root = psutil.Process(self.root_pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            processes = []
        for process in (*processes, *self._adopted()):
            if process.pid not in self._seen:
                seen = _identity(process)
                if seen is not None:
                    self._seen[process.pid] = seen

    def _tracked(self) -> Iterator[psutil.Process]:
        for seen in self._seen.values():
            try:
                process = psutil.Process(seen.pid)
                if process.create_time() == seen.create_time:
                    yield process
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue

    def _same_session_or_group(self) -> Iterator[psutil.Process]:
        own = os.getpid()
        for process in psutil.process_iter():
            if process.pid == own:
                continue
            try:
                if self.root_pid in (os.getsid(process.pid), os.getpgid(process.pid)):
                    yield process
            except (ProcessLookupError, PermissionError):
                continue

    def _members(self) -> list[psutil.Process]:
        self.snapshot()
        found: dict[int, psutil.Process] = {}
        for process in (*self._tracked(), *self._same_session_or_group()):
            found.setdefault(process.pid, process)
        return [p for p in found.values() if _alive(p)]

    def survivors(self, *, include_root: bool = False) -> list[int]:
        """Pids of the runtime's processes still running (zombies do not count)."""
        return sorted(p.pid for p in self._members() if include_root or p.pid != self.root_pid)

    def kill_all(self, timeout: float = 2.0) -> KillReport:
        """SIGKILL the runtime's group and every process of its tree, session or adoption.

        Members are looked up again after each round, so a process forked while the others
        were being killed is found and killed too. Adopted processes are reaped. The root
        itself is signalled but not waited for here: it is the caller's child, and reaping it
        belongs to whoever spawned it. ``unkillable`` lists what still ran at the deadline.
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.root_pid, signal.SIGKILL)
        signalled: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            self._reap_adopted()
            pending = self._members()
            if not pending or time.monotonic() >= deadline:
                break
            _signal_all(pending)
            signalled.update(p.pid for p in pending)
            time.sleep(0.01)
        unkillable = sorted(p.pid for p in pending)
        return KillReport(signalled=sorted(signalled), unkillable=unkillable)

    def _reap_adopted(self) -> None:
        """``waitpid`` every adopted child of ours that has exited (never the root)."""
        if self.adopter != os.getpid():
            return
        for seen in list(self._seen.values()):
            if seen.pid == self.root_pid:
                continue  # asyncio's child watcher waits for the root
            try:
                process = psutil.Process(seen.pid)
                # Only the process we saw (a reused pid may be someone else's child).
                if process.create_time() != seen.create_time or process.ppid() != self.adopter:
                    continue
                os.waitpid(seen.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError, OSError):
                continue


@dataclass(frozen=True, slots=True)
class KillReport:
    signalled: list[int]
    unkillable: list[int]


def _signal_all(processes: Iterable[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.kill()


def reap_orphans() -> list[int]:
    """Reap exited children without waiting; needed only when we run as PID 1 in a container.

    A killed grandchild is re-parented to PID 1, and an init that never calls ``wait`` keeps
    it as a zombie.
    """
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)
