"""Shared pytest wiring. Fixtures live in ``tests/fixtures/`` one module per real service."""

from __future__ import annotations

from hypothesis import settings

# Tests never fail on timing: Hypothesis' default 200 ms deadline per example turns a loaded
# 2-core CI machine into failures (DeadlineExceeded/Flaky). Loaded before any test module
# builds its own settings, which inherit it.
settings.register_profile("thop", deadline=None)
settings.load_profile("thop")

# Each plugin module owns one real part: PostgreSQL with Airflow's schema, the
# Kubernetes control plane with its process node, the language-runtime builds, and the
# servers sources are synced from (git over HTTP and SSH, static files, S3).
pytest_plugins = [
    "tests.fixtures.postgres_plugin",
    "tests.fixtures.kube",
    "tests.fixtures.realnode",
    "tests.fixtures.runtimes_plugin",
    "tests.fixtures.sources",
]
