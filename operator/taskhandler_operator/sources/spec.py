"""The ``source`` part of a TaskHandlerBundle spec: where a bundle's files come from.

Placeholder with the agreed shape, so ``kube/`` can build on it; the sources work (issue 11)
owns this module and replaces it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

__all__ = ["GitSource", "HttpSource", "S3Source", "SecretRef", "SourceSpec", "VolumeSource"]


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SecretRef(_Spec):
    """A Secret in the bundle's namespace holding the source's credentials."""

    name: str = Field(min_length=1, description="Name of the Secret, in the bundle's namespace.")


class GitSource(_Spec):
    """A git repository, fetched with the git CLI."""

    url: str = Field(min_length=1, description="Repository URL (https://, http:// or ssh://).")
    ref: str = Field(
        default="main", min_length=1, description="Branch, tag or full commit to check out."
    )
    path: str = Field(
        default="", description="Folder inside the repository holding the bundle; '' is the root."
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Credentials: username/password or a token for HTTPS, identity and "
        "known_hosts for SSH.",
    )


class HttpSource(_Spec):
    """One file or a .tar.gz/.tgz/.zip archive at a URL, pinned by its SHA-256."""

    url: str = Field(min_length=1, description="URL of the file or archive.")
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="SHA-256 of the download, 64 lowercase hex digits; a mismatch is refused."
    )
    secret_ref: SecretRef | None = Field(
        default=None, description="Credentials: a bearer token or username/password."
    )


class S3Source(_Spec):
    """Objects under a prefix of an S3-compatible bucket."""

    bucket: str = Field(min_length=1, description="Bucket name.")
    prefix: str = Field(default="", description="Key prefix of the bundle's objects.")
    endpoint: str | None = Field(
        default=None, description="Endpoint URL of an S3-compatible server; default: AWS."
    )
    region: str = Field(default="us-east-1", description="Region used to sign requests.")
    path_style: bool = Field(
        default=True, description="Address the bucket in the path rather than the host name."
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Static credentials (access key id and secret); default: the default "
        "credential chain.",
    )


class VolumeSource(_Spec):
    """A folder the operator can read, e.g. a PersistentVolumeClaim mounted into its pod."""

    path: Annotated[str, Field(pattern=r"^/")] = Field(
        description="Absolute path of the folder in the operator's file system."
    )
    sub_path: str = Field(default="", description="Folder below path holding the bundle.")


class SourceSpec(_Spec):
    """Where the bundle's files come from: exactly one of git, http, s3, volume."""

    git: GitSource | None = Field(default=None, description="A git repository.")
    http: HttpSource | None = Field(default=None, description="A file or archive over HTTP(S).")
    s3: S3Source | None = Field(default=None, description="An S3-compatible bucket.")
    volume: VolumeSource | None = Field(default=None, description="A mounted folder.")

    @model_validator(mode="after")
    def _exactly_one(self) -> SourceSpec:
        given = [k for k in ("git", "http", "s3", "volume") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "source must name exactly one of git, http, s3, volume"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self
