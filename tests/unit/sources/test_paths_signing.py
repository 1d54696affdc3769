"""Pure rules: relative paths inside a revision, error redaction, URL signing."""

from __future__ import annotations

import pytest

from taskhandler_operator.sources import signing
from taskhandler_operator.sources.errors import (
    ArchiveRefused,
    SourceError,
    redact,
    shown_url,
)
from taskhandler_operator.sources.paths import (
    UnsafePath,
    check_name,
    check_revision_id,
    safe_rel_path,
)
from taskhandler_operator.sources.signing import Verdict

KEY = b"k" * 32


@pytest.mark.parametrize(
    ("name", "clean"),
    [("a", "a"), ("./a//b/", "a/b"), ("a/./b", "a/b"), ("dir/file.jar", "dir/file.jar")],
)
def test_safe_rel_path_normalises(name: str, clean: str) -> None:
    assert safe_rel_path(name) == clean


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("../etc/passwd", "escapes"),
        ("a/../../b", "escapes"),
        ("/etc/passwd", "absolute"),
        ("a\\..\\b", "backslash"),
        ("a\x00b", "control character"),
        ("a\nb", "control character"),
        ("", "root"),
        ("./", "root"),
        ("x" * 256, "over 255 bytes"),
        ("/".join(["abcdefgh"] * 200), "over 1024 bytes"),
    ],
)
def test_safe_rel_path_refuses(name: str, reason: str) -> None:
    with pytest.raises(UnsafePath, match=reason):
        safe_rel_path(name)


def test_names_and_revision_ids() -> None:
    assert check_name("team-a", "namespace") == "team-a"
    for bad in ("Team", "-a", "a_b", "", "a" * 254, ".hidden"):
        with pytest.raises(ValueError, match="not a valid Kubernetes object name"):
            check_name(bad, "namespace")
    assert check_revision_id("0" * 40 + "-abc") == "0" * 40 + "-abc"
    for bad in (".tmp-x", "..", "a/b", "", "a b"):
        with pytest.raises(ValueError, match="revision id"):
            check_revision_id(bad)


def test_redact_replaces_every_secret_and_its_lines() -> None:
    key = "-----BEGIN KEY-----\nAAAAsecretline1\nBBBBsecretline2\n-----END KEY-----\n"
    text = "failed with token abc123xyz and line BBBBsecretline2 and short ab"
    out = redact(text, [b"abc123xyz", key, b"ab"])
    assert "abc123xyz" not in out and "BBBBsecretline2" not in out
    assert out.count("***") == 2
    assert "short ab" in out  # too short to redact on its own


def test_shown_url_drops_user_info_and_query() -> None:
    assert shown_url("https://u:p@h.example:8443/a/b?sig=1#f") == "https://h.example:8443/a/b"
    assert shown_url("ssh://git@h/r.git") == "ssh://git@h/r.git"
    assert shown_url("git@github.com:org/r.git") == "github.com:org/r.git"


def test_source_errors_are_one_line_with_a_reason() -> None:
    error = ArchiveRefused("first\nsecond   third")
    assert error.message == "first second third"
    assert error.reason == "ArchiveRefused" and error.permanent
    assert isinstance(error, SourceError)
    assert len(SourceError("x" * 5000).message) <= 1000


# -- signing -----------------------------------------------------------------------------------


def _place() -> signing.SignedPlace:
    return signing.place("team-a", "bundle", "abc123", "lib/app.jar")


def _query(path: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in path.split("?", 1)[1].split("&"))


def test_signed_path_shape_and_verification() -> None:
    path = signing.signed_path(KEY, _place(), 60, now=1_000)
    assert path.startswith("/v1/artifacts/team-a/bundle/abc123/lib/app.jar?expires=1060&")
    query = _query(path)
    assert signing.verify(KEY, _place(), query["expires"], query["signature"], now=1_000) is (
        Verdict.SERVED
    )


def test_verification_refusals() -> None:
    query = _query(signing.signed_path(KEY, _place(), 60, now=1_000))
    expires, signature = query["expires"], query["signature"]
    assert signing.verify(KEY, _place(), None, None) is Verdict.UNSIGNED
    assert signing.verify(KEY, _place(), expires, None) is Verdict.UNSIGNED
    assert signing.verify(KEY, _place(), expires, signature, now=2_000) is Verdict.EXPIRED
    assert signing.verify(KEY, _place(), "1061", signature, now=1_000) is Verdict.TAMPERED
    assert signing.verify(KEY, _place(), "-5", signature, now=1_000) is Verdict.TAMPERED
    other = signing.place("team-a", "bundle", "abc123", "lib/other.jar")
    assert signing.verify(KEY, other, expires, signature, now=1_000) is Verdict.TAMPERED
    assert signing.verify(b"o" * 32, _place(), expires, signature, now=1_000) is (Verdict.TAMPERED)


def test_signing_refuses_weak_keys_and_bad_places() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        signing.sign(b"short", _place(), 1)
    with pytest.raises(UnsafePath):
        signing.place("ns", "b", "r", "../x")
    with pytest.raises(ValueError, match="expires_in"):
        signing.signed_path(KEY, _place(), 0)


def test_path_components_are_percent_encoded() -> None:
    path = signing.signed_path(KEY, signing.place("ns", "b", "r", "a dir/x#y.jar"), 5, now=0)
    assert path.startswith("/v1/artifacts/ns/b/r/a%20dir/x%23y.jar?")


@pytest.mark.parametrize("value", ["ns\n", "ns\r", "ns\n\n", "\nns"])
def test_names_are_checked_whole(value: str) -> None:
    # '$' matches before a final newline: the names must match whole.
    with pytest.raises(ValueError, match="not a valid Kubernetes object name"):
        check_name(value, "namespace")


@pytest.mark.parametrize("value", ["abc\n", "a" * 40 + "\n"])
def test_revision_ids_are_checked_whole(value: str) -> None:
    with pytest.raises(ValueError, match="revision id"):
        check_revision_id(value)


def test_a_commit_ref_is_forty_hex_digits_whole() -> None:
    from taskhandler_operator.sources.spec import GitSource

    assert GitSource(url="https://g/x.git", ref="a" * 40).is_commit
    assert not GitSource(url="https://g/x.git", ref="a" * 41).is_commit


# --- check-artifact-server's verdicts (sources/selfcheck.py: judge) -------------------------


def test_the_self_check_names_each_way_it_fails() -> None:
    from taskhandler_operator.sources.selfcheck import Answer, ArtifactServerCheckFailed, judge

    url = "http://thop.ops.svc:8090"
    ok, forged = Answer(404, "missing"), Answer(403, "tampered")
    assert judge(url, ok, forged).startswith(f"artifact server {url}: a URL signed with the")
    cases = {
        (Answer(403, "tampered"), forged): "the operator signs with another key",
        (Answer(403, "expired"), forged): "clock and the operator's differ",
        (Answer(200, "hello"), forged): "HTTP 200 'hello' (expected 404 missing)",
        (Answer(404, "page not found"), forged): "is that URL the operator's artifact server?",
        (ok, Answer(404, "missing")): "to a URL with a forged signature (expected 403 tampered)",
    }
    for (signed, bad), words in cases.items():
        with pytest.raises(ArtifactServerCheckFailed) as caught:
            judge(url, signed, bad)
        assert words in caught.value.message, caught.value.message
