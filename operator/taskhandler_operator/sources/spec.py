"""The ``source`` part of a TaskHandlerBundle spec: where a bundle's files come from.

These models are the boundary for user input: the operator validates ``spec.source`` with
them and ``kube/`` generates the CRD's schema from them, so every field has a description and
the constraints are ones a structural schema can express (types, patterns, lengths); deeper
checks (a URL's scheme, a path's components) are validators that give a one-line reason.

The keys each kind reads from the Secret named by ``secretRef`` are fixed (see
``docs/sources.md``):

* git over HTTPS: ``username`` + ``password``, or ``token`` (sent as the password, with
  ``username`` if given, else ``git``); over SSH: ``identity`` (a private key without a
  passphrase) and ``known_hosts`` (required: the server's host key is always checked);
* http: ``token`` (a bearer token) or ``username`` + ``password`` (basic auth);
* s3: ``accessKeyID`` + ``secretAccessKey``, optional ``sessionToken``.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

__all__ = [
    "GIT_SECRET_KEYS",
    "HTTP_SECRET_KEYS",
    "S3_SECRET_KEYS",
    "SOURCE_KINDS",
    "GitSource",
    "HttpSource",
    "S3Source",
    "SecretRef",
    "SourceSpec",
    "VolumeSource",
]

SOURCE_KINDS = ("git", "http", "s3", "volume")
GIT_SECRET_KEYS = ("username", "password", "token", "identity", "known_hosts")
HTTP_SECRET_KEYS = ("token", "username", "password")
S3_SECRET_KEYS = ("accessKeyID", "secretAccessKey", "sessionToken")

_COMMIT = re.compile(r"[0-9a-f]{40}")
# scp-like git address: [user@]host:path (no scheme, the colon before any slash).
_SCP_LIKE = re.compile(r"(?:[A-Za-z0-9._~-]+@)?[A-Za-z0-9.-]+:(?!//)[^\s]+")

# An http(s) URL's port, checked by the model and by the CRD (the same message): a port out of
# range or not a number would pass both and fail at every sync as an untyped error. The CRD
# states it as one regular expression: CEL's url() library is costed far over the apiserver's
# budget for a 2,048-character string, ``matches`` is not.
URL_PORT_MESSAGE = "must be a valid URL whose port, if any, is a number from 1 to 65535"
_PORT = r"0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# Userinfo is let through here on purpose: the model refuses credentials in a URL naming the
# field only, while an admission refusal would echo the whole value (a password) back to the
# client and into the apiserver's audit log.
URL_PATTERN = (
    r"^[hH][tT][tT][pP][sS]?://([^/?#@ ]*@)?(\[[0-9A-Za-z:.%]+\]|[^/?#:\[\]@ ]+)"
    rf"(:({_PORT})?)?([/?#].*)?$"
)
_URL = re.compile(URL_PATTERN)
# A single-quoted CEL string literal (the pattern holds backslashes, no quote).
_PORT_RULE = "self.matches('" + URL_PATTERN.replace("\\", "\\\\") + "')"
URL_PORT_RULE: JsonDict = {
    "x-kubernetes-validations": [{"rule": _PORT_RULE, "message": URL_PORT_MESSAGE}]
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Spec(BaseModel):
    # hide_input_in_errors: a refused URL may carry credentials; errors name the field only.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
    )


def _relative_folder(value: str, what: str) -> str:
    """``value`` as a clean relative folder ('' for the root), or ValueError naming ``what``."""
    if _CONTROL.search(value):
        raise ValueError(f"{what} contains a control character")
    if value.startswith("/"):
        raise ValueError(f"{what} must be relative (no leading '/'), got {value!r}")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{what} must not contain '..', got {value!r}")
    return "/".join(parts)


def _http_url(value: str, what: str) -> str:
    try:
        parts = urlsplit(value)
        port = parts.port  # ValueError: not a number, or out of 0-65535
    except ValueError:
        raise ValueError(f"{what} {URL_PORT_MESSAGE}") from None
    if port == 0:
        raise ValueError(f"{what} {URL_PORT_MESSAGE}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http:// or https:// URL, got {_shown(value)!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{what} must not carry credentials; put them in the Secret (secretRef)")
    if not _URL.fullmatch(value):  # the CRD's rule, so both refuse the same URLs
        raise ValueError(f"{what} {URL_PORT_MESSAGE}")
    return value


def _shown(url: str) -> str:
    """A URL safe to echo in an error: no user info, no query (it may hold a signature)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if port is not None:
        host = f"{host}:{port}"
    if not parts.scheme:
        return url.split("@", 1)[-1][:200]
    return f"{parts.scheme}://{host}{parts.path}"[:200]


class SecretRef(_Spec):
    """A Secret in the bundle's namespace holding the source's credentials."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of the Secret, in the bundle's namespace. The keys read from it depend "
        "on the source kind (see each kind's secretRef).",
    )


class GitSource(_Spec):
    """A git repository, fetched with the git CLI."""

    url: str = Field(
        min_length=1,
        max_length=2048,
        description="Repository URL: https://, http://, ssh:// or scp-like user@host:path. "
        "Credentials never go in the URL; use secretRef.",
    )
    ref: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        description="Branch, tag or full 40-hex commit to check out; refs/heads/NAME or "
        "refs/tags/NAME when a branch and a tag share a name.",
    )
    path: str = Field(
        default="",
        max_length=1024,
        description="Folder inside the repository holding the bundle; '' is the root.",
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with username and password, or token, for HTTPS; identity (a "
        "private key) and known_hosts for SSH.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if _CONTROL.search(value) or value.startswith("-"):
            raise ValueError("git url contains a control character or starts with '-'")
        if _SCP_LIKE.fullmatch(value):
            return value
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError:
            raise ValueError(f"git url {URL_PORT_MESSAGE}") from None
        if port == 0:
            raise ValueError(f"git url {URL_PORT_MESSAGE}")
        if parts.scheme not in ("https", "http", "ssh") or not parts.hostname:
            raise ValueError(
                f"git url must be https://, http://, ssh:// or user@host:path, got "
                f"{_shown(value)!r}"
            )
        if parts.password is not None or (parts.username is not None and parts.scheme != "ssh"):
            raise ValueError("git url must not carry credentials; put them in the Secret")
        return value

    @field_validator("ref")
    @classmethod
    def _check_ref(cls, value: str) -> str:
        # What git check-ref-format refuses, plus a leading '-' (it would read as an option).
        bad = (
            value.startswith(("-", "/"))
            or value.endswith(("/", ".", ".lock"))
            or ".." in value
            or "//" in value
            or "@{" in value
            or re.search(r"[\x00-\x20\x7f~^:?*\[\\]", value) is not None
        )
        if bad:
            raise ValueError(f"git ref {value!r} is not a valid branch, tag or commit name")
        return value

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _relative_folder(value, "git path")

    @property
    def is_commit(self) -> bool:
        return _COMMIT.fullmatch(self.ref) is not None


class HttpSource(_Spec):
    """One file, or a .tar.gz/.tgz/.tar/.zip archive, at a URL, pinned by its SHA-256."""

    url: str = Field(
        min_length=1,
        max_length=2048,
        json_schema_extra=URL_PORT_RULE,
        description="URL of the file or archive (http:// or https://). A path ending in "
        ".tar.gz, .tgz, .tar or .zip is extracted; anything else is stored as one file named "
        "after the URL's last path segment.",
    )
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="SHA-256 of the download, 64 lowercase hex digits; a download with another "
        "digest is refused."
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with token (sent as a bearer token) or username and password "
        "(basic auth). Sent only to the URL's own host, never after a redirect elsewhere.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _http_url(value, "http url")

    @property
    def archive_format(self) -> str | None:
        """'tar.gz', 'tar' or 'zip' when the URL names an archive, else None (one file)."""
        name = posixpath.basename(urlsplit(self.url).path).lower()
        if name.endswith((".tar.gz", ".tgz")):
            return "tar.gz"
        if name.endswith(".tar"):
            return "tar"
        if name.endswith(".zip"):
            return "zip"
        return None


class S3Source(_Spec):
    """Objects under a prefix of an S3-compatible bucket."""

    bucket: str = Field(
        min_length=3,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$",
        description="Bucket name.",
    )
    prefix: str = Field(
        default="",
        max_length=1024,
        description="Folder (key prefix) holding the bundle's objects; a trailing '/' is "
        "implied, '' is the whole bucket.",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        json_schema_extra=URL_PORT_RULE,
        description="Endpoint URL of an S3-compatible server (http:// or https://); default: "
        "AWS S3 for the region.",
    )
    region: str = Field(
        default="us-east-1",
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9-]+$",
        description="Region used to sign requests (SigV4).",
    )
    path_style: bool = Field(
        default=True,
        description="Address the bucket in the URL path rather than the host name (most "
        "S3-compatible servers need this).",
    )
    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret with accessKeyID and secretAccessKey (optional sessionToken); "
        "without it the default credential chain is used (environment, web identity, "
        "instance metadata).",
    )

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return _relative_folder(value, "s3 prefix")

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value, "s3 endpoint")

    @property
    def key_prefix(self) -> str:
        """The prefix as listed: '' or a folder ending in '/'."""
        return f"{self.prefix}/" if self.prefix else ""


class VolumeSource(_Spec):
    """A folder the operator can read, e.g. a PersistentVolumeClaim mounted into its pod."""

    path: Annotated[str, Field(pattern=r"^/", max_length=1024)] = Field(
        description="Absolute path of the folder in the operator's file system (a mounted "
        "PersistentVolumeClaim or hostPath)."
    )
    sub_path: str = Field(
        default="",
        max_length=1024,
        description="Folder below path holding the bundle; '' is path itself.",
    )

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if _CONTROL.search(value):
            raise ValueError("volume path contains a control character")
        if ".." in value.split("/"):
            raise ValueError(f"volume path must not contain '..', got {value!r}")
        return value

    @field_validator("sub_path")
    @classmethod
    def _check_sub_path(cls, value: str) -> str:
        return _relative_folder(value, "volume subPath")


class SourceSpec(_Spec):
    """Where the bundle's files come from: exactly one of git, http, s3, volume."""

    git: GitSource | None = Field(default=None, description="A git repository.")
    http: HttpSource | None = Field(default=None, description="A file or archive over HTTP(S).")
    s3: S3Source | None = Field(default=None, description="An S3-compatible bucket.")
    volume: VolumeSource | None = Field(default=None, description="A mounted folder.")

    @model_validator(mode="after")
    def _exactly_one(self) -> SourceSpec:
        given = [k for k in SOURCE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "source must name exactly one of git, http, s3, volume"
                + (f" (got {', '.join(given)})" if given else " (got none)")
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SOURCE_KINDS if getattr(self, k) is not None)

    @property
    def secret_ref(self) -> SecretRef | None:
        """The Secret the caller must read before ``sync`` (None: no credentials)."""
        chosen = getattr(self, self.kind)
        ref: SecretRef | None = getattr(chosen, "secret_ref", None)
        return ref
