"""The test-side NetworkPolicy evaluator (tests/network_policy.py) on hand-written policies."""

from __future__ import annotations

from typing import Any

import pytest

from tests.network_policy import Endpoint, allowed, selects

APP = {"app": "probe"}
PROBE = Endpoint.pod("team-a", APP)
SERVER = Endpoint.pod("ops", {"app": "server"})
OTHER = Endpoint.pod("team-a", {"app": "other"})


def policy(namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": APP}, **spec},
    }


def test_no_policy_allows_everything() -> None:
    assert allowed([], PROBE, SERVER, 1)
    assert allowed([], PROBE, Endpoint.host("10.0.0.1"), 443)


def test_egress_isolation_allows_only_listed_peers_and_ports() -> None:
    only_server = policy(
        "team-a",
        policyTypes=["Egress"],
        egress=[
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "ops"}
                        },
                        "podSelector": {"matchLabels": {"app": "server"}},
                    }
                ],
                "ports": [{"port": 8090}],
            }
        ],
    )
    assert allowed([only_server], PROBE, SERVER, 8090)
    assert not allowed([only_server], PROBE, SERVER, 8080)
    assert not allowed([only_server], PROBE, SERVER, 8090, "UDP")
    assert not allowed([only_server], PROBE, Endpoint.host("10.0.0.1"), 8090)
    assert not allowed([only_server], PROBE, Endpoint.pod("other", {"app": "server"}), 8090)
    # Another pod in the namespace is not selected by the policy: not isolated.
    assert allowed([only_server], OTHER, Endpoint.host("10.0.0.1"), 443)


def test_ingress_side_counts_and_empty_ingress_denies_all() -> None:
    deny_in = policy("team-a", policyTypes=["Ingress"], ingress=[])
    assert not allowed([deny_in], SERVER, PROBE, 80)
    assert allowed([deny_in], PROBE, SERVER, 80)  # its egress is not isolated


def test_policy_types_default_and_selectors_without_namespace() -> None:
    same_ns = policy(
        "team-a", egress=[{"to": [{"podSelector": {"matchLabels": {"app": "other"}}}]}]
    )
    # policyTypes absent and an egress section: both directions isolated.
    assert allowed([same_ns], PROBE, OTHER, 1)
    assert not allowed([same_ns], PROBE, Endpoint.pod("team-b", {"app": "other"}), 1)
    assert not allowed([same_ns], OTHER, PROBE, 1)  # ingress isolated, no ingress rules


def test_ip_blocks_ranges_and_expressions() -> None:
    blocks = policy(
        "team-a",
        policyTypes=["Egress"],
        egress=[
            {
                "to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.96.0.0/12"]}}],
                "ports": [{"port": 5000, "endPort": 5010}],
            }
        ],
    )
    assert allowed([blocks], PROBE, Endpoint.host("10.1.2.3"), 5005)
    assert not allowed([blocks], PROBE, Endpoint.host("10.96.0.1"), 5005)
    assert not allowed([blocks], PROBE, Endpoint.host("10.1.2.3"), 5011)
    assert selects(
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}, {"a": "x"}
    )
    assert not selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {})
    assert selects({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {})
    assert not selects({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""})


def test_named_ports_are_refused_not_guessed() -> None:
    named = policy("team-a", policyTypes=["Egress"], egress=[{"ports": [{"port": "http"}]}])
    with pytest.raises(ValueError, match="named port"):
        allowed([named], PROBE, SERVER, 80)
