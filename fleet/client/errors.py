"""Say why a request to the API server failed, for logs and CLI output.

A TLS verification failure reaches callers as an httpx `ConnectError` whose
own text is empty: httpcore's Trio backend wraps `trio.BrokenResourceError`,
whose cause holds the `ssl.SSLCertVerificationError` that says what was
wrong.  `explain(exc)` walks the cause chain (and single-exception groups) and
renders the outer exception's type with the most telling message inside, plus
a hint when the server's certificate could not be verified.
"""

from __future__ import annotations

import ssl

TLS_HINT = ("the server's certificate is not signed by the CA this client trusts: check the "
            "certificate-authority(-data) of the kubeconfig, or --ca-file / the join token's CA")


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 16 and cur not in out:  # bounded: chains can be cyclic
        out.append(cur)
        if isinstance(cur, BaseExceptionGroup) and len(cur.exceptions) == 1:
            cur = cur.exceptions[0]
            continue
        cur = cur.__cause__ or cur.__context__
    return out


def explain(exc: BaseException, *, tls_hint: str = TLS_HINT) -> str:
    """`ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED] ... (hint)` — never an empty string.

    `tls_hint` is what to suggest when a certificate could not be verified (the
    default speaks of the API server; the image puller names its registries file).
    """
    chain = _chain(exc)
    plain = [e for e in chain if not isinstance(e, BaseExceptionGroup)] or chain
    outer = type(plain[0]).__name__
    tls = next((e for e in plain if isinstance(e, ssl.SSLError)), None)
    if tls is not None:
        text = str(tls) or type(tls).__name__
        hint = f" ({tls_hint})" if tls_hint and isinstance(tls, ssl.SSLCertVerificationError) else ""
        return f"{outer}: {text}{hint}"
    # The innermost errno says what happened ("Connection refused") where the
    # outer messages only say that connecting failed.
    errno_text = next((f"[Errno {e.errno}] {e.strerror}" for e in reversed(plain)
                       if isinstance(e, OSError) and e.errno and e.strerror), "")
    for e in plain:
        if str(e):
            text = str(e)
            if errno_text and errno_text not in text:
                text = f"{text} ({errno_text})"
            return f"{outer}: {text}"
    if errno_text:
        return f"{outer}: {errno_text}"
    return f"{outer} (no further detail: {' <- '.join(type(e).__name__ for e in chain)})"


__all__ = ["TLS_HINT", "explain"]
