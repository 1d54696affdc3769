"""One redaction for every output (issue 25, item 5): each credential form, scrubbed before
a cut."""

from __future__ import annotations

import base64

import pytest

from taskhandler_operator.controller.logs import Redactor
from taskhandler_operator.kube.status import MAX_ITEM_MESSAGE_CHARS, Problem
from taskhandler_operator.redaction import credential_spellings, scrub
from taskhandler_operator.sources.errors import MAX_MESSAGE_LENGTH, HttpFetchFailed

USER, PASSWORD = "deploy", "hunter2-Zq9"
PAIR = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload", "eyJhbGci"),
        (f"HTTP 401 Basic {PAIR}", PAIR),
        ("cloning https://deploy:hunter2-Zq9@git.example/x.git", "hunter2"),
        ("GET https://ghp_abcdefghijklmnop@git.example/x.git", "ghp_abcd"),
        ("key AKIAIOSFODNN7EXAMPLE refused", "AKIAIOSFODNN7EXAMPLE"),
        (
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20261201/us-east-1/s3/aws4_request, "
            "SignedHeaders=host, "
            "Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630",
            "fe5f80f77d5",
        ),
        ("https://b.s3/k?X-Amz-Credential=AKIAX%2F2026&X-Amz-Signature=abcdef0123", "abcdef0123"),
        ('{"secretAccessKey": "wJalrXUtnFEMI/K7MDENG"}', "wJalrXUtnFEMI"),
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI"),
    ],
)
def test_recognisable_credentials_are_scrubbed(text: str, gone: str) -> None:
    assert gone not in scrub(text)


def test_prose_about_credentials_is_left_alone() -> None:
    text = "check the token or username/password (basic auth) in the bundle's Secret"
    assert scrub(text) == text


def test_known_values_in_every_spelling_and_the_basic_auth_pair() -> None:
    secret = {"username": USER.encode(), "password": PASSWORD.encode()}
    spellings = credential_spellings(secret)
    assert PAIR in spellings
    text = f"echo {PAIR} / {PASSWORD} / {base64.b64encode(PASSWORD.encode()).decode()}"
    scrubbed = scrub(text, spellings)
    assert PASSWORD not in scrubbed and PAIR not in scrubbed and "aHVudGVy" not in scrubbed
    token = {"token": b"tok-123456789"}
    git_pair = base64.b64encode(b"git:tok-123456789").decode()
    assert git_pair in credential_spellings(token)


@pytest.mark.parametrize("offset", range(MAX_MESSAGE_LENGTH - 40, MAX_MESSAGE_LENGTH, 1))
def test_a_source_error_scrubs_before_it_cuts(offset: int) -> None:
    token = "Bearer " + "t0k3n" * 8
    message = HttpFetchFailed("x" * offset + " " + token + " tail").message
    assert len(message) <= MAX_MESSAGE_LENGTH
    assert "t0k3n" not in message


def test_status_messages_are_scrubbed_before_they_are_cut() -> None:
    # The cut falls inside the password, before the "@" that makes it recognisable.
    text = "y" * (MAX_ITEM_MESSAGE_CHARS - 20) + " https://u:p4ssw0rd-long@h/x"
    problem = Problem(severity="error", kind="unreadable", message=text)
    assert len(problem.message) <= MAX_ITEM_MESSAGE_CHARS
    assert "p4ss" not in problem.message


def test_the_log_redactor_masks_the_basic_auth_pair_of_a_secret() -> None:
    redactor = Redactor()
    redactor.add_credentials({"username": USER.encode(), "password": PASSWORD.encode()})
    assert PAIR not in redactor(f"reason: Basic {PAIR}")
    assert PAIR not in redactor(f"echoed {PAIR}")
    assert PASSWORD not in redactor(f"password was {PASSWORD}")
