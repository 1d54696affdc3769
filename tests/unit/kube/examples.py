"""Shared TaskHandlerBundle documents for the kube unit and integration tests."""

from __future__ import annotations

import copy
from typing import Any

SHA = "a" * 64


def bundle_body(name: str = "etl", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A valid TaskHandlerBundle (a git source) with ``spec`` keys replaced."""
    body: dict[str, Any] = {
        "apiVersion": "langsdk.dev/v1alpha1",
        "kind": "TaskHandlerBundle",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "bundleName": "etl-bundle",
            "language": "go",
            "queues": ["go", "go-fast"],
            "source": {"git": {"url": "https://git.example/etl.git"}},
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


# (what is wrong, spec keys to replace, text the CRD's message and the model's error share)
INVALID_SPECS: list[tuple[str, dict[str, Any], str]] = [
    (
        "two source kinds",
        {
            "source": {
                "git": {"url": "https://g/x.git"},
                "http": {"url": "https://h/x", "sha256": SHA},
            }
        },
        "source must name exactly one of git, http, s3, volume",
    ),
    ("no source kind", {"source": {}}, "source must name exactly one of git, http, s3, volume"),
    ("a bad duration", {"interval": "5 minutes"}, "must be a positive duration such as 30s"),
    ("a zero duration", {"timeout": "0s"}, "must be a positive duration such as 30s"),
    ("a bad probe timeout", {"probe": {"timeout": "1d"}}, "must be a positive duration"),
    (
        "a bad queue name",
        {"queues": ["bad queue"]},
        "queue names must start with a letter or digit",
    ),
    ("a queue name with a leading dash", {"queues": ["-x"]}, "queue names must start with"),
    ("parallelism 0", {"probe": {"parallelism": 0}}, "probe.parallelism must be between 1 and 32"),
    (
        "parallelism 33",
        {"probe": {"parallelism": 33}},
        "probe.parallelism must be between 1 and 32",
    ),
    (
        "a bad bundleName",
        {"bundleName": "my bundle"},
        "bundleName must start with a letter or digit",
    ),
    (
        "a bad quantity",
        {"probe": {"resources": {"limits": {"memory": "lots"}}}},
        "must be a Kubernetes quantity",
    ),
    *(
        (
            f"an http url with port {port}",
            {"source": {"http": {"url": f"https://files.example:{port}/b.tgz", "sha256": SHA}}},
            "must be a valid URL whose port, if any, is a number from 1 to 65535",
        )
        for port in ("99999", "abc", "-1", "0")
    ),
    (
        "an s3 endpoint with port 70000",
        {"source": {"s3": {"bucket": "bkt", "endpoint": "http://s3.example:70000"}}},
        "must be a valid URL whose port, if any, is a number from 1 to 65535",
    ),
    (
        "an unparsable http url",
        {"source": {"http": {"url": "http://[::1/x", "sha256": SHA}}},
        "must be a valid URL whose port, if any, is a number from 1 to 65535",
    ),
]
