"""Reason phrases on HTTP/1.1 status lines, as Go's net/http writes them.

kube-apiserver answers `HTTP/1.1 404 Not Found`; h11 (under hypercorn) writes
`HTTP/1.1 404 ` because ASGI carries no reason phrase.  Clients print the
status line (curl -v, the Python client's `ApiException` "Reason: Not Found",
requests' `resp.reason`), so the API listener's HTTP/1.1 protocol
(upgrade.UpgradeH11Protocol) fills it in from Go's `http.StatusText` table —
Go's words, not Python's `HTTPStatus` phrases, which differ for a few codes
(414, 422 and 413 in newer Pythons).  HTTP/2 has no reason phrase.
"""

from __future__ import annotations

from http import HTTPStatus

import h11

# Go's net/http statusText where it differs from Python's HTTPStatus phrase (or where
# Python has none): the rest of the table is the same words.
_GO_PHRASES = {
    413: "Request Entity Too Large",
    414: "Request URI Too Long",
    416: "Requested Range Not Satisfiable",
    418: "I'm a teapot",
    422: "Unprocessable Entity",
    425: "Too Early",
}


def reason_phrase(code: int) -> str:
    """Go's http.StatusText(code); for a code Go does not know, `status code N`
    (what net/http writes on the status line then)."""
    if code in _GO_PHRASES:
        return _GO_PHRASES[code]
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return f"status code {code}"


def with_reason(event: h11.Response | h11.InformationalResponse) -> h11.Response | h11.InformationalResponse:
    """The same response event, its reason phrase filled in if it has none."""
    if event.reason:
        return event
    return type(event)(status_code=event.status_code, headers=event.headers, http_version=event.http_version,
                       reason=reason_phrase(event.status_code).encode("ascii"))


__all__ = ["reason_phrase", "with_reason"]
