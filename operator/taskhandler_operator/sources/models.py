"""What a sync returns (:class:`Revision`) and what the store keeps beside each revision."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Revision", "RevisionRecord", "SourceKind"]

SourceKind = Literal["git", "http", "s3", "volume"]


class Revision(BaseModel):
    """An immutable revision folder of one bundle.

    ``id`` names the folder and is what probe Jobs and URLs refer to: the commit for git (plus
    a digest of ``path`` when one is set), the pinned sha256 for http (plus a digest of the file
    name for a single file), a digest of the listing for s3 and volume. ``source`` is the
    source's own identity as a user reads it, e.g. ``main@sha1:<commit>``.
    """

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Folder name of the revision; stable for unchanged content.")
    namespace: str
    bundle: str
    kind: SourceKind
    source: str = Field(description="e.g. main@sha1:<commit>, sha256:<hex>")
    path: Path = Field(description="The revision folder.")
    file_count: int = Field(ge=0)
    bytes: int = Field(ge=0)
    fetched_at: datetime


class RevisionRecord(BaseModel):
    """The store's record of a revision: the revision, when a sync last returned it, and
    kind-specific details a later sync reuses (an ETag, an S3 listing, a volume's file keys)."""

    model_config = ConfigDict(frozen=True)

    revision: Revision
    synced_at: datetime
    details: dict[str, Any] = Field(default_factory=dict)
