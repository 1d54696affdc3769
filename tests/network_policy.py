"""A small, pure evaluator of ``networking.k8s.io/v1`` NetworkPolicies.

The test process node enforces no NetworkPolicy, so the security tests ask this evaluator
which connections the chart's rendered policies allow. It follows the API's documented
semantics (https://kubernetes.io/docs/concepts/services-networking/network-policies/):

* a pod is isolated for egress (ingress) when some policy in its namespace selects it with
  ``Egress`` (``Ingress``) in ``policyTypes`` (which defaults to ``[Ingress]``, plus ``Egress``
  when the policy has an ``egress`` section); an isolated pod allows only what the union of
  those policies' rules allows; a pod no policy isolates allows everything;
* a connection needs both ends to allow it: the source's egress and the destination's ingress;
* a peer's ``podSelector``/``namespaceSelector`` select pods only (a ``namespaceSelector``
  absent means the policy's own namespace); ``ipBlock`` matches addresses, minus ``except``;
* a rule without ``to``/``from`` matches every peer, one without ``ports`` every port; a port
  without ``protocol`` is TCP, ``endPort`` makes a range. Named ports are not resolved (the
  chart uses numbers); meeting one is an error rather than a guess.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Policy = Mapping[str, Any]
Direction = Literal["Ingress", "Egress"]


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (``pod_labels`` not None) or an address outside any pod
    (a node's or the apiserver's host network, an external database)."""

    ip: str
    namespace: str | None = None
    pod_labels: Mapping[str, str] | None = None
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def pod(cls, namespace: str, labels: Mapping[str, str], ip: str = "10.244.0.10") -> Endpoint:
        ns_labels = {"kubernetes.io/metadata.name": namespace}
        return cls(ip, namespace, dict(labels), ns_labels)

    @classmethod
    def host(cls, ip: str) -> Endpoint:
        return cls(ip)


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Does a LabelSelector select ``labels``? (An empty selector selects everything.)"""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {op!r}")
    return True


def peer_matches(peer: Mapping[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other.ip)
        if address not in ipaddress.ip_network(block["cidr"], strict=False):
            return False
        return not any(
            address in ipaddress.ip_network(e, strict=False) for e in block.get("except") or ()
        )
    if other.pod_labels is None:  # pod and namespace selectors select pods only
        return False
    ns_selector = peer.get("namespaceSelector")
    if ns_selector is None:
        if other.namespace != policy_namespace:
            return False
    elif not selects(ns_selector, other.namespace_labels):
        return False
    return selects(peer.get("podSelector"), other.pod_labels)


def port_matches(rule_port: Mapping[str, Any], port: int, protocol: str) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True
    if isinstance(wanted, str):
        raise ValueError(f"named port {wanted!r}: this evaluator resolves numbers only")
    end = rule_port.get("endPort", wanted)
    return bool(wanted <= port <= end)


def policy_types(policy: Policy) -> list[str]:
    spec = policy["spec"]
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if "egress" in spec else ["Ingress"]


def isolating(policies: Iterable[Policy], pod: Endpoint, direction: Direction) -> list[Policy]:
    """The policies in ``pod``'s namespace that select it for ``direction``."""
    if pod.pod_labels is None:
        return []
    return [
        p
        for p in policies
        if p.get("kind") == "NetworkPolicy"
        and p["metadata"].get("namespace") == pod.namespace
        and direction in policy_types(p)
        and selects(p["spec"].get("podSelector") or {}, pod.pod_labels)
    ]


def _side_allows(
    policies: Iterable[Policy],
    pod: Endpoint,
    other: Endpoint,
    port: int,
    protocol: str,
    direction: Direction,
) -> bool:
    applying = isolating(policies, pod, direction)
    if pod.pod_labels is None or not applying:
        return True  # not a pod, or a pod no policy isolates: everything is allowed
    section, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    for policy in applying:
        for rule in policy["spec"].get(section) or ():
            peers = rule.get(peers_key)
            if peers is not None and not any(
                peer_matches(peer, pod.namespace or "", other) for peer in peers
            ):
                continue
            ports = rule.get("ports")
            if ports is not None and not any(port_matches(p, port, protocol) for p in ports):
                continue
            return True
    return False


def allowed(
    policies: Iterable[Policy],
    source: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """May ``source`` open a connection to ``destination``'s ``port``?"""
    listed = list(policies)
    return _side_allows(listed, source, destination, port, protocol, "Egress") and _side_allows(
        listed, destination, source, port, protocol, "Ingress"
    )
