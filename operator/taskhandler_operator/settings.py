"""The operator's settings: one typed object read from the environment and command-line flags.

Every setting has an environment variable (``THOP_`` + its name in upper case) and a flag
(``--`` + its name with dashes); a flag wins over the variable, the variable over the default.
:func:`load_settings` is the one place they are read; a bad value is a :class:`SettingsError`
whose one-line message names the variable and the flag. See docs/settings.md for the table.

The database URL usually carries a password, so it may come from a file instead
(``THOP_DATABASE_URL_FILE``, a mounted Secret) and is kept as a ``SecretStr``: it never
appears in a repr, a log or an error message.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from taskhandler_operator.inputfiles import InputError, read_bounded, read_text

ENV_PREFIX = "THOP_"
Port = Annotated[int, Field(ge=1, le=65535)]
LogFormat = Literal["json", "text"]
LogLevel = Literal["debug", "info", "warning", "error"]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
#: As sources.signing.MIN_KEY_BYTES (settings import nothing of the product's packages).
MIN_SIGNING_KEY_BYTES = 32
SECRET_FILE_MAX_BYTES = 64 << 10  # a URL or a key: a larger file is a mistake
#: How logs, metrics and docs name the shard of the bundles without a shard label (shard "").
DEFAULT_SHARD = "default"
#: A shard name is a label value and part of the Lease name (taskhandler-operator-<shard>,
#: and the chart's object names): a DNS-1123 label short enough for both.
MAX_SHARD_LENGTH = 40
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class SettingsError(ValueError):
    """A setting that is missing, malformed or contradictory; the message is one line."""


class RuntimeImages(BaseModel):
    """The container image that runs each language's probe.

    Go artifacts are static executables: without an image of their own they run in the
    operator's image. A language without an image cannot be probed; its bundles say so.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    go: str | None = None
    java: str | None = None
    typescript: str | None = None


def _split_list(value: object) -> object:
    """``a, b,c`` -> ``("a", "b", "c")``: lists in variables are comma-separated."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        frozen=True,
        # THOP_ variables a probe pod or a test sets (THOP_TERMINATION_LOG, THOP_CACHE, ...)
        # are not settings of the operator; only the fields below are read.
    )

    database_url: SecretStr | None = Field(
        default=None, description="SQLAlchemy URL of Airflow's PostgreSQL metadata database"
    )
    database_url_file: Path | None = Field(
        default=None, description="a file holding the database URL (a mounted Secret)"
    )
    database_connect_timeout: int = Field(
        default=10, ge=1, le=3600, description="seconds to wait for a database connection"
    )
    database_statement_timeout: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="seconds one database statement may run (the server cancels it; the client "
        "gives up on a server that does not answer 5 s later); 0 leaves the server's setting "
        "and the client unbounded",
    )
    database_lock_timeout: float = Field(
        default=30.0,
        ge=0,
        le=86400,
        description="seconds one statement may wait for a lock (the bundle's advisory lock, "
        "Airflow's row locks); 0 leaves the server's setting",
    )
    database_idle_in_transaction_timeout: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="seconds the server keeps a session idle inside a transaction before ending "
        "it; 0 leaves the server's setting",
    )
    database_tcp_user_timeout: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="seconds sent data may stay unacknowledged before the connection is dropped",
    )
    database_keepalives_idle: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="seconds of silence before TCP keepalive probes start (then every 10 s, "
        "3 unanswered probes drop the connection)",
    )
    pass_timeout: float = Field(
        default=1800.0,
        ge=1,
        le=86400,
        description="seconds one reconcile pass may take; a pass past it is abandoned with "
        "the condition reason PassTimedOut and retried with back-off (its probe Jobs keep "
        "running and are adopted)",
    )
    publication_history: int = Field(
        default=20,
        ge=1,
        le=10000,
        description="publications kept per bundle in the publication history (older ones are "
        "dropped in the transaction that records a new one)",
    )
    namespaces: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="namespaces to watch, comma-separated; empty means every namespace",
    )
    shard: str = Field(
        default="",
        description="the shard whose TaskHandlerBundles this operator reconciles: the bundles "
        "labelled langsdk.dev/shard=<shard>; empty (the default shard) takes the bundles "
        "without that label. A DNS-1123 label of at most 40 characters, not 'default'",
    )
    shard_resync_seconds: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description="seconds between two listings of this shard's TaskHandlerBundles by the "
        "leader, which stop the reconciler of any bundle that left the shard without its watch "
        "telling (a DELETED lost when a watch expires); 0 disables it",
    )
    cluster_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="this cluster's identity in bundle claims; default: the uid of the "
        "kube-system namespace, which differs between clusters",
    )
    revision_store: Path = Field(
        default=Path("/var/lib/taskhandler-operator/revisions"),
        description="folder holding synced source revisions",
    )
    revisions_kept: int = Field(default=3, ge=1, description="revisions kept per bundle")
    volume_roots: Annotated[tuple[Path, ...], NoDecode] = Field(
        default=(),
        description="folders volume sources may read below, comma-separated absolute paths; "
        "empty (the default) refuses every volume source",
    )
    artifact_server_bind: str = Field(
        default="0.0.0.0:8090",
        pattern=r"^[^\s:]*:\d{1,5}$",
        description="host:port the artifact server listens on",
    )
    artifact_server_url: AnyHttpUrl | None = Field(
        default=None,
        description="base URL probe pods download artifacts from; default: the operator "
        "Service's address",
    )
    signing_key_file: Path | None = Field(
        default=None,
        description="a file holding the artifact server's URL signing key (a mounted Secret, "
        "at least 32 bytes); default: a key made at start, so a restarted operator's "
        "earlier download URLs stop working",
    )
    runtime_images: RuntimeImages = Field(
        default_factory=RuntimeImages, description="probe image per language"
    )
    probe_parallelism: int = Field(
        default=4, ge=1, le=256, description="probe Jobs running at once, all bundles together"
    )
    probe_image_pull_policy: PullPolicy | None = Field(
        default=None,
        description="imagePullPolicy of the probe Jobs' containers (Always, IfNotPresent or "
        "Never); default: Kubernetes' (Always for :latest, else IfNotPresent)",
    )
    metrics_port: Port = Field(default=8080, description="Prometheus metrics port")
    health_port: Port = Field(default=8081, description="liveness/readiness probe port")
    liveness_event_loop_seconds: float = Field(
        default=30.0,
        gt=0,
        description="/healthz fails when the event loop has not run its 1 s ticker for this long",
    )
    liveness_election_seconds: float = Field(
        default=60.0,
        gt=0,
        description="/healthz fails when the leader election loop has not ticked for this long",
    )
    liveness_inventory_seconds: float = Field(
        default=120.0,
        gt=0,
        description="/healthz fails when the stub-inventory poller has not polled for this long",
    )
    liveness_pass_seconds: float = Field(
        default=10800.0,
        gt=0,
        description="/healthz fails when one bundle's pass has run this long (a stuck "
        "reconciler; a bundle that sleeps between passes never counts)",
    )
    log_format: LogFormat = Field(default="json", description="json or text")
    log_level: LogLevel = Field(default="info", description="debug, info, warning or error")

    _split_namespaces = field_validator("namespaces", mode="before")(_split_list)
    _split_volume_roots = field_validator("volume_roots", mode="before")(_split_list)

    @field_validator("shard")
    @classmethod
    def _valid_shard(cls, shard: str) -> str:
        if not shard:
            return shard
        if shard == DEFAULT_SHARD:
            raise ValueError(
                f"{shard!r} is reserved: the default shard (the bundles without a shard "
                "label) is the empty value"
            )
        if len(shard) > MAX_SHARD_LENGTH or not _DNS_LABEL.fullmatch(shard):
            raise ValueError(
                f"{shard!r} is not a shard name: lower-case letters, digits and '-', starting "
                f"and ending with a letter or digit, at most {MAX_SHARD_LENGTH} characters"
            )
        return shard

    @property
    def shard_name(self) -> str:
        """The shard as logs and metrics name it: ``default`` for the default shard."""
        return self.shard or DEFAULT_SHARD

    @field_validator("volume_roots")
    @classmethod
    def _absolute_roots(cls, roots: tuple[Path, ...]) -> tuple[Path, ...]:
        for root in roots:
            if not root.is_absolute():
                raise ValueError(f"{str(root)!r} is not an absolute path")
        return roots

    def resolved_database_url(self) -> str | None:
        """The database URL from ``database_url`` or the file ``database_url_file``; None when
        neither is set. Raises :class:`SettingsError` when both are, or the file is unusable."""
        if self.database_url is not None and self.database_url_file is not None:
            raise SettingsError(
                f"set {ENV_PREFIX}DATABASE_URL (--database-url) or {ENV_PREFIX}DATABASE_URL_FILE "
                "(--database-url-file), not both"
            )
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        if self.database_url_file is None:
            return None
        path = self.database_url_file
        try:
            url = read_text(path, "the database URL file", max_bytes=SECRET_FILE_MAX_BYTES)
        except InputError as exc:
            raise SettingsError(str(exc)) from None
        url = url.strip()
        if not url:
            raise SettingsError(f"the database URL file {path} is empty")
        return url

    def resolved_signing_key(self) -> bytes | None:
        """The artifact server's signing key from ``signing_key_file`` (its bytes, surrounding
        whitespace removed so ``openssl rand -hex 32 > key`` works); None when unset. Raises
        :class:`SettingsError` when the file is unusable or the key too short; the message never
        holds the key."""
        path = self.signing_key_file
        if path is None:
            return None
        try:
            key = read_bounded(path, "the signing key file", max_bytes=SECRET_FILE_MAX_BYTES)
        except InputError as exc:
            raise SettingsError(str(exc)) from None
        key = key.strip()
        if len(key) < MIN_SIGNING_KEY_BYTES:
            raise SettingsError(
                f"the signing key file {path} holds {len(key)} bytes; it needs at least "
                f"{MIN_SIGNING_KEY_BYTES} (e.g. openssl rand -hex 32)"
            )
        return key


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


def add_arguments(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """Add a flag for each setting in ``names`` (all by default). Flags default to None, so an
    absent flag leaves the environment's value."""
    for name in names if names is not None else list(Settings.model_fields):
        field = Settings.model_fields[name]
        help_text = f"{field.description} (default: ${env_of(name)})"
        if name == "runtime_images":
            parser.add_argument(
                "--runtime-image",
                dest="runtime_images",
                action="append",
                metavar="LANGUAGE=IMAGE",
                help=f"probe image of one language, repeatable (default: "
                f"${ENV_PREFIX}RUNTIME_IMAGES__<LANGUAGE>)",
            )
        elif name == "namespaces":
            parser.add_argument(
                "--namespace",
                dest="namespaces",
                action="append",
                metavar="NS",
                help=f"a namespace to watch, repeatable (default: ${env_of(name)}, "
                "comma-separated; none means every namespace)",
            )
        else:
            parser.add_argument(flag_of(name), dest=name, default=None, help=help_text)


def _flag_values(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "runtime_images":
            value = _images_of(value)
        values[name] = value
    return values


def _images_of(pairs: Sequence[str]) -> dict[str, str]:
    images: dict[str, str] = {}
    for pair in pairs:
        language, sep, image = pair.partition("=")
        if not sep or not language or not image:
            raise SettingsError(f"--runtime-image {pair!r}: expected LANGUAGE=IMAGE")
        images[language.strip()] = image.strip()
    return images


def load_settings(args: argparse.Namespace | None = None) -> Settings:
    """The settings from ``args`` (the flags given), then the environment, then the defaults.
    Raises :class:`SettingsError` (one line, never the value of a secret) on a bad value."""
    try:
        return Settings(**(_flag_values(args) if args is not None else {}))
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ())]
    name = loc[0] if loc else "?"
    where = f"{env_of(name)} ({flag_of(name)})"
    if name == "runtime_images" and len(loc) > 1:
        where = f"{ENV_PREFIX}RUNTIME_IMAGES__{loc[1].upper()} (--runtime-image {loc[1]}=...)"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    message = str(first.get("msg", "invalid"))
    if first.get("type") == "extra_forbidden" and name == "runtime_images":
        message = f"unknown language {loc[-1]!r}, expected go, java or typescript"
    return f"invalid setting {where}: {message}{more}"
