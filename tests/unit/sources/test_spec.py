"""The source spec models: what a user may write, and the one-line reasons for what not."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from taskhandler_operator.sources.spec import GitSource, HttpSource, S3Source, SourceSpec

PIN = "a" * 64


def _error(data: object) -> str:
    with pytest.raises(ValidationError) as info:
        SourceSpec.model_validate(data)
    return str(info.value)


def test_exactly_one_kind_is_required() -> None:
    assert "exactly one of git, http, s3, volume (got none)" in _error({})
    both = _error({"git": {"url": "https://h/r.git"}, "volume": {"path": "/data"}})
    assert "(got git, volume)" in both


def test_camel_case_and_snake_case_both_parse() -> None:
    camel = SourceSpec.model_validate(
        {"s3": {"bucket": "my-bucket", "pathStyle": False, "secretRef": {"name": "s3-creds"}}}
    )
    snake = SourceSpec.model_validate(
        {"s3": {"bucket": "my-bucket", "path_style": False, "secret_ref": {"name": "s3-creds"}}}
    )
    assert camel == snake
    assert camel.kind == "s3"
    assert camel.secret_ref is not None and camel.secret_ref.name == "s3-creds"
    assert camel.model_dump(by_alias=True)["s3"]["pathStyle"] is False


def test_defaults() -> None:
    git = GitSource(url="https://example.com/r.git")
    assert (git.ref, git.path, git.secret_ref) == ("main", "", None)
    s3 = S3Source(bucket="abc")
    assert (s3.prefix, s3.endpoint, s3.region, s3.path_style) == ("", None, "us-east-1", True)
    assert s3.key_prefix == ""
    assert S3Source(bucket="abc", prefix="a/b/").key_prefix == "a/b/"


def test_unknown_fields_are_refused() -> None:
    assert "extra" in _error({"git": {"url": "https://h/r.git", "branch": "main"}}).lower()


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/org/repo.git",
        "http://127.0.0.1:8080/git/r.git",
        "ssh://git@example.com:2222/org/repo.git",
        "git@github.com:org/repo.git",
    ],
)
def test_git_urls_accepted(url: str) -> None:
    assert GitSource(url=url).url == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///etc", "must be https://"),
        ("ext::sh -c touch% /tmp/pwned", "must be https://"),
        ("-uhttps://x", "starts with '-'"),
        ("https://user:secret@example.com/r.git", "must not carry credentials"),
        ("https://token@example.com/r.git", "must not carry credentials"),
    ],
)
def test_git_urls_refused(url: str, reason: str) -> None:
    message = _error({"git": {"url": url}})
    assert reason in message
    assert "secret@" not in message  # the refused URL's credentials are not echoed


@pytest.mark.parametrize("ref", ["main", "v1.2.0", "refs/heads/main", "release/2026", "a" * 40])
def test_git_refs_accepted(ref: str) -> None:
    assert GitSource(url="https://h/r.git", ref=ref).ref == ref


@pytest.mark.parametrize("ref", ["-x", "a..b", "x~1", "x^", "with space", "x.lock", "a:b"])
def test_git_refs_refused(ref: str) -> None:
    assert "not a valid branch, tag or commit name" in _error(
        {"git": {"url": "https://h/r.git", "ref": ref}}
    )


def test_git_commit_detection() -> None:
    assert GitSource(
        url="https://h/r.git", ref="0123456789abcdef0123456789abcdef01234567"
    ).is_commit
    assert not GitSource(url="https://h/r.git", ref="main").is_commit


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("path", "/abs", "must be relative"),
        ("path", "a/../../b", "must not contain '..'"),
        ("path", "a\x00b", "control character"),
    ],
)
def test_git_path_refused(field: str, value: str, reason: str) -> None:
    assert reason in _error({"git": {"url": "https://h/r.git", field: value}})


def test_git_path_normalised() -> None:
    assert GitSource(url="https://h/r.git", path="./bundles//go/").path == "bundles/go"


def test_http_pin_required_and_lowercase_hex() -> None:
    assert "sha256" in _error({"http": {"url": "https://h/a.tgz"}})
    assert "pattern" in _error({"http": {"url": "https://h/a.tgz", "sha256": "A" * 64}})


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("https://h/b.tar.gz", "tar.gz"),
        ("https://h/b.TGZ?x=1", "tar.gz"),
        ("https://h/b.tar", "tar"),
        ("https://h/b.zip", "zip"),
        ("https://h/handler", None),
        ("https://h/app.jar", None),
    ],
)
def test_http_archive_format_from_the_url(url: str, kind: str | None) -> None:
    assert HttpSource(url=url, sha256=PIN).archive_format == kind


def test_http_url_refusals() -> None:
    assert "http:// or https://" in _error({"http": {"url": "ftp://h/a", "sha256": PIN}})
    message = _error({"http": {"url": "https://u:pw-secret@h/a", "sha256": PIN}})
    assert "must not carry credentials" in message and "pw-secret" not in message


def test_s3_bucket_and_endpoint_rules() -> None:
    assert "pattern" in _error({"s3": {"bucket": "Upper_Case"}})
    assert "http:// or https://" in _error({"s3": {"bucket": "abc", "endpoint": "s3.local"}})
    assert "must not contain '..'" in _error({"s3": {"bucket": "abc", "prefix": "../x"}})


def test_volume_rules() -> None:
    assert "pattern" in _error({"volume": {"path": "relative"}})
    assert "must not contain '..'" in _error({"volume": {"path": "/a/../b"}})
    assert "must be relative" in _error({"volume": {"path": "/data", "subPath": "/x"}})
    ok = SourceSpec.model_validate({"volume": {"path": "/data", "subPath": "bundles/a/"}})
    assert ok.volume is not None and ok.volume.sub_path == "bundles/a"


def test_every_field_has_a_description() -> None:
    """The CRD schema is generated from these models: each field must explain itself."""
    schema = SourceSpec.model_json_schema(by_alias=True)
    for name, definition in schema["$defs"].items():
        for field, body in definition.get("properties", {}).items():
            assert body.get("description"), f"{name}.{field} has no description"
    for field, body in schema["properties"].items():
        assert body.get("description"), f"SourceSpec.{field} has no description"
