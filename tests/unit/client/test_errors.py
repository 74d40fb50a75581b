"""fleet.client.errors.explain: a failed request always says why."""

from __future__ import annotations

import ssl

import httpx
import pytest
import trio

from fleet.client.errors import TLS_HINT, explain

VERIFY = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate chain"


def chained(*layers: BaseException) -> BaseException:
    """layers[0] raised from layers[1] raised from ... (the innermost last)."""
    exc = layers[-1]
    for outer in reversed(layers[:-1]):
        outer.__cause__ = exc
        exc = outer
    return exc


@pytest.mark.parametrize(("exc", "expected"), [
    # httpcore's Trio backend: an empty ConnectError over BrokenResourceError over the SSL error.
    (chained(httpx.ConnectError(""), trio.BrokenResourceError(), ssl.SSLCertVerificationError(1, VERIFY)),
     f"ConnectError: {VERIFY} ({TLS_HINT})"),
    (chained(httpx.ConnectError(""), ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")),
     "ConnectError: [SSL: WRONG_VERSION_NUMBER] wrong version number"),
    (chained(httpx.ConnectError(""), ConnectionRefusedError(111, "Connection refused")),
     "ConnectError: [Errno 111] Connection refused"),
    (httpx.ReadTimeout(""), "ReadTimeout (no further detail: ReadTimeout)"),
    (ExceptionGroup("g", [chained(httpx.ConnectError(""), OSError(113, "No route to host"))]),
     "ConnectError: [Errno 113] No route to host"),
    (RuntimeError("plain"), "RuntimeError: plain"),
])
def test_explain(exc: BaseException, expected: str) -> None:
    assert explain(exc) == expected


def test_a_cyclic_chain_ends() -> None:
    a, b = RuntimeError(""), ValueError("")
    a.__cause__, b.__cause__ = b, a
    assert explain(a).startswith("RuntimeError (no further detail")
