"""Per-request admission warnings, surfaced as HTTP `Warning` headers.

Admission plugins run deep inside the write path, far from the response they
would annotate.  kube-apiserver carries warnings in the request context
(`warning.AddWarning(ctx, ...)`); Fleet does the same with a ContextVar that the
API server opens around each request (`begin` / `end` in fleet/server/app.py)
and folds into the response's `Warning` header.  Outside a request (tests that
call a plugin directly, controllers) `add` is a no-op.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

_CURRENT: ContextVar[list[str] | None] = ContextVar("fleet_admission_warnings", default=None)


def begin() -> Token[list[str] | None]:
    """Open a fresh warning list for the request the current task serves."""
    return _CURRENT.set([])


def end(token: Token[list[str] | None]) -> list[str]:
    """Close the request's list; return what was added (deduplicated, in order)."""
    out = _CURRENT.get() or []
    _CURRENT.reset(token)
    return list(dict.fromkeys(out))


def add(message: str) -> None:
    """Warn the client about the request being served (no-op outside a request)."""
    cur = _CURRENT.get()
    if cur is not None and message:
        cur.append(message)


def current() -> list[str]:
    return list(_CURRENT.get() or [])
