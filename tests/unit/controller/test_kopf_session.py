"""kopf gets an HTTP session with a bounded connection pool (controller/switchboard.py).

kopf's own session opens as many connections as there are concurrent requests, and asyncio
gives each TLS connection a 256 KiB read buffer: at start-up kopf patches every bundle at once,
which cost about 0.3 MiB of peak RSS per bundle (docs/operations.md, the RSS bullet).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import kopf
import pytest

from taskhandler_operator.controller.switchboard import (
    KOPF_REQUEST_CONNECTIONS,
    SwitchboardConfig,
    bounded_session,
    build_registry,
)

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
users:
- name: u
  user:
    token: secret-token
contexts:
- name: x
  context: {cluster: c, user: u, namespace: ns1}
current-context: x
"""


def login_handler(namespaces: tuple[str, ...], kubeconfig: str | None = "set") -> Any:
    runtime = SimpleNamespace(settings=SimpleNamespace(namespaces=namespaces))
    registry = build_registry(SwitchboardConfig(cast(Any, runtime), kubeconfig=kubeconfig))
    # kopf keeps activity handlers in a private registry; the one login handler is ours.
    handlers = [
        h for h in registry._activities.get_all_handlers() if h.activity == "authentication"
    ]
    assert len(handlers) == 1
    return handlers[0].fn


# Three watch streams per scope: bundles, probe Jobs and probe pods.
@pytest.mark.parametrize(("namespaces", "watches"), [((), 3), (("a",), 3), (("a", "b", "c"), 9)])
def test_login_gives_kopf_a_session_with_a_bounded_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespaces: tuple[str, ...], watches: int
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    login = login_handler(namespaces)

    async def check() -> None:
        result = await login(logger=logging.getLogger("test"), settings=kopf.OperatorSettings())
        assert isinstance(result, kopf.AiohttpSession)
        session = result.aiohttp_session
        try:
            assert result.server == "https://127.0.0.1:6443"
            assert result.default_namespace == "ns1"
            assert session.headers["Authorization"] == "Bearer secret-token"
            connector = session.connector
            assert isinstance(connector, aiohttp.TCPConnector)
            # kopf's own session has limit=0 (unbounded); the watch streams come on top.
            assert connector.limit == KOPF_REQUEST_CONNECTIONS + watches
        finally:
            await session.close()

    asyncio.run(check())


def test_the_service_account_login_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    account = kopf.ConnectionInfo(
        server="https://kubernetes.default.svc", scheme="Bearer", token="sa", default_namespace="o"
    )
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    login = login_handler(("a",), kubeconfig=None)

    async def check() -> None:
        result = await login(logger=logging.getLogger("test"), settings=kopf.OperatorSettings())
        assert isinstance(result, kopf.AiohttpSession)
        session = result.aiohttp_session
        try:
            assert (result.server, result.default_namespace) == ("https://10.96.0.1:443", "o")
            assert session.headers["Authorization"] == "Bearer sa"
            assert session.connector is not None
            assert session.connector.limit == KOPF_REQUEST_CONNECTIONS + 3
        finally:
            await session.close()

    asyncio.run(check())


def test_bounded_session_keeps_the_connection_settings() -> None:
    info = kopf.ConnectionInfo(
        server="https://10.0.0.1:443",
        scheme="Bearer",
        token="t",
        insecure=True,
        default_namespace="d",
        proxy_url="http://proxy:3128",
        priority=7,
    )

    async def check() -> None:
        result = bounded_session(info, 5)
        session = result.aiohttp_session
        try:
            assert (result.server, result.default_namespace, result.priority) == (
                "https://10.0.0.1:443",
                "d",
                7,
            )
            assert session.headers["Authorization"] == "Bearer t"
            assert session.connector is not None and session.connector.limit == 5
        finally:
            await session.close()

    asyncio.run(check())
