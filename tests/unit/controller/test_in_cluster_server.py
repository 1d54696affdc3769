"""The service-account login's apiserver URL follows the pod's KUBERNETES_SERVICE_* variables."""

from __future__ import annotations

import pytest

from taskhandler_operator.controller.switchboard import in_cluster_server


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
            "https://10.96.0.1:443",
        ),
        (
            {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "36443"},
            "https://127.0.0.1:36443",
        ),
        (
            {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
            "https://[fd00::1]:443",
        ),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None),
        ({"KUBERNETES_SERVICE_PORT": "443"}, None),
        ({}, None),
    ],
)
def test_in_cluster_server(env: dict[str, str], expected: str | None) -> None:
    assert in_cluster_server(env) == expected
