"""Fixtures for the controller's integration tests: the async API wrapper on the real cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from kubernetes import client as k8s_client

from taskhandler_operator.controller.kubeapi import KubeApi
from taskhandler_operator.controller.logs import Redactor

T = TypeVar("T")


@pytest.fixture
async def kubeapi(kube_api: k8s_client.ApiClient) -> AsyncIterator[KubeApi]:
    api = KubeApi(kube_api, redactor=Redactor(), reporting_instance="test-pod_1a2b")
    try:
        yield api
    finally:
        await api.aclose()


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    within: float = 60.0,
    interval: float = 0.1,
) -> T:
    """Await ``probe`` until it returns something truthy; fail naming ``what`` and the last
    value or error after ``within`` seconds (a bound against hangs, not a speed assertion)."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)
