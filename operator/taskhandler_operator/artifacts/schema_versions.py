"""Supervisor schema versions this supervisor can speak (reference ``airflow-langsdk.md`` §6.6).

A worker resolves an artifact's ``supervisor_schema_version`` in its schema bundle before it
launches anything, and refuses a version it does not know; verification (and so ``verify``,
``probe`` and a probe pod's init container) does the same.
"""

from __future__ import annotations

__all__ = ["KNOWN_SCHEMA_VERSIONS", "UnknownSchemaVersion", "check_known_schema_version"]

# Newest first, as the supervisor's version bundle lists them.
KNOWN_SCHEMA_VERSIONS: tuple[str, ...] = (
    "2026-10-30",
    "2026-09-30",
    "2026-08-02",
    "2026-07-30",
    "2026-06-30",
    "2026-06-23",
    "2026-06-16",
)


class UnknownSchemaVersion(ValueError):
    pass


def check_known_schema_version(artifact: str, version: str) -> None:
    if version not in KNOWN_SCHEMA_VERSIONS:
        raise UnknownSchemaVersion(
            f"{artifact} uses supervisor schema version {version!r}, which this supervisor "
            f"does not support (supported: {KNOWN_SCHEMA_VERSIONS[-1]} to "
            f"{KNOWN_SCHEMA_VERSIONS[0]}: {', '.join(KNOWN_SCHEMA_VERSIONS)})"
        )
