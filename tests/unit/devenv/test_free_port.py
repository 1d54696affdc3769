"""free_port: never the same port twice, never an ephemeral one, never one in use."""

from __future__ import annotations

import socket

import pytest

from taskhandler_devenv.kubecluster import procs


def test_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    # The kernel's bind(0) may hand out a port again as soon as its socket is closed: CI once
    # gave one operator the same port for two of its three servers.
    low, high = procs.FREE_PORT_RANGE
    ephemeral_low, ephemeral_high = procs.ephemeral_ports()
    ports = [procs.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    if high < ephemeral_low or low > ephemeral_high:  # Linux's default range, as here
        assert all(low <= port <= high for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[-1]))  # what it handed out can be bound


def test_a_port_in_use_or_handed_out_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    real = procs._pick
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        handed = procs.free_port()
        first = iter([busy, handed, busy])

        class Picks:
            """Offers the busy port and the handed-out one first, then random ports."""

            def randint(self, low: int, high: int) -> int:
                return next(first, None) or real.randint(low, high)

        monkeypatch.setattr(procs, "_pick", Picks())
        port = procs.free_port()
    assert port not in (busy, handed)
    assert next(first, None) is None  # all three were offered and refused
