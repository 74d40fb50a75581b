"""Auth challenges, pull-secret credentials, and the registry's error messages."""

from __future__ import annotations

import base64

import httpx
import pytest

from fleet.runtime.images import Credentials, credentials_for, parse_challenges
from fleet.runtime.images.auth import Challenge, registry_error_message


@pytest.mark.parametrize(
    ("header", "want"),
    [
        ('Basic realm="registry"', [Challenge("basic", {"realm": "registry"})]),
        (
            'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
            'scope="repository:library/busybox:pull"',
            [Challenge("bearer", {
                "realm": "https://auth.docker.io/token",
                "service": "registry.docker.io",
                "scope": "repository:library/busybox:pull",
            })],
        ),
        (
            # Spaces after commas, a scope listing several actions, unquoted token.
            'Bearer realm="https://a/t", service=reg, scope="repository:x/y:pull,push"',
            [Challenge("bearer", {"realm": "https://a/t", "service": "reg",
                                  "scope": "repository:x/y:pull,push"})],
        ),
        (
            'Basic realm="b", Bearer realm="https://t",service="s"',
            [Challenge("basic", {"realm": "b"}),
             Challenge("bearer", {"realm": "https://t", "service": "s"})],
        ),
        ('BEARER realm="q\\"uote"', [Challenge("bearer", {"realm": 'q"uote'})]),
        ("", []),
    ],
)
def test_parse_challenges(header: str, want: list[Challenge]) -> None:
    assert parse_challenges(header) == want


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


SECRETS = [
    {"auths": {"registry.example.com:5000": {"username": "u1", "password": "p1"}}},
    {"auths": {
        "https://index.docker.io/v1/": {"auth": _b64("hubuser:hubpass")},
        "*.corp.example": {"auth": _b64("wild:card")},
        "exact.corp.example": {"auth": _b64("exact:wins")},
        "http://plain.example/v2/": {"username": "p", "password": "q"},
        "broken.example": {"auth": "!!!not base64"},
    }},
    # Legacy .dockercfg: no "auths" wrapper.
    {"legacy.example": {"auth": _b64("old:style:with:colons")}},
]


@pytest.mark.parametrize(
    ("host", "want"),
    [
        ("registry.example.com:5000", Credentials("u1", "p1")),
        ("registry.example.com", None),  # the port is part of the key
        ("docker.io", Credentials("hubuser", "hubpass")),
        ("registry-1.docker.io", Credentials("hubuser", "hubpass")),
        ("a.corp.example", Credentials("wild", "card")),
        ("exact.corp.example", Credentials("exact", "wins")),
        ("a.b.corp.example", None),  # a wildcard matches one label
        ("plain.example", Credentials("p", "q")),
        ("broken.example", None),
        ("legacy.example", Credentials("old", "style:with:colons")),
        ("nowhere.example", None),
    ],
)
def test_credentials_for(host: str, want: Credentials | None) -> None:
    assert credentials_for(host, SECRETS) == want


def test_first_secret_wins_and_junk_is_ignored() -> None:
    configs = [
        "not a dict",
        {"auths": {"r.example": {}}},
        {"auths": {"r.example": {"username": "a", "password": "1"}}},
        {"auths": {"r.example": {"username": "b", "password": "2"}}},
    ]
    assert credentials_for("r.example", configs) == Credentials("a", "1")  # type: ignore[arg-type]


def test_credentials_repr_hides_the_password() -> None:
    assert "hunter2" not in repr(Credentials("me", "hunter2"))


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        (404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]},
         "manifest unknown"),
        (401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
         "unauthorized: authentication required"),
        (403, {"errors": [{"code": "DENIED", "message": "requested access to the resource is denied"}]},
         "denied: requested access to the resource is denied"),
        (401, {"details": "incorrect username or password"}, "incorrect username or password"),
        (500, None, "500 Internal Server Error"),
    ],
)
def test_registry_error_message(status: int, body: object, want: str) -> None:
    resp = httpx.Response(status, json=body) if body is not None else httpx.Response(status)
    assert registry_error_message(resp) == want
