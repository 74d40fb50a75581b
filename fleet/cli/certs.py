"""`fleet certs check|rotate`: the cluster PKI of a server's data directory
(fleet/auth/pki.py), read and rotated on disk.

A running server notices a rotation on its next renewal tick (it re-reads
`<data-dir>/tls/`): it serves the re-issued certificate, rewrites
admin.kubeconfig with the new CA bundle and renews its components' certificates,
while the previous CA stays trusted for the overlap window.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import cyclopts

if TYPE_CHECKING:
    from fleet.auth.pki import ClusterPKI

app = cyclopts.App(name="certs", help="Inspect and rotate the cluster's certificates.")

DataDir = Annotated[Path | None, cyclopts.Parameter(
    help="The server's state directory (default /var/lib/fleet as root, else ~/.local/share/fleet).")]


def _pki(data_dir: Path | None) -> ClusterPKI:
    from fleet.auth.pki import ClusterPKI
    from fleet.client.kubeconfig import default_data_dir

    d = data_dir or default_data_dir()
    if not (Path(d) / "tls").is_dir():
        sys.exit(f"fleet certs: no cluster PKI under {d} (start `fleet server --data-dir {d}` once)")
    return ClusterPKI(d)


def format_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


@app.command
def check(*, data_dir: DataDir = None) -> None:
    """Every CA and server certificate: subject, issuer, expiry, days left, status.

    Exits 1 if any is expired, not yet valid or missing."""
    pki = _pki(data_dir)
    rows: list[tuple[str, ...]] = [("NAME", "SUBJECT", "ISSUER", "NOT AFTER", "DAYS LEFT", "STATUS")]
    bad = False
    for st in pki.check():
        rows.append((st.name, st.subject, st.issuer,
                     st.not_after.strftime("%Y-%m-%dT%H:%M:%SZ") if st.status != "MISSING" else "",
                     f"{st.days_left:.1f}" if st.status != "MISSING" else "", st.status))
        bad = bad or st.status in ("EXPIRED", "NOT-YET-VALID", "MISSING")
    print(format_table(rows))
    if bad:
        sys.exit(1)


@app.command
def rotate(*, ca: Literal["server", "client", "requestheader", "all"] = "all",
           data_dir: DataDir = None,
           overlap: Annotated[float | None, cyclopts.Parameter(
               help="Seconds the previous CA stays trusted (default: one leaf lifetime).")] = None,
           ) -> None:
    """Replace a CA (or all): the old one stays trusted for an overlap window, the new
    one is cross-signed by it, and the server's certificates are re-issued."""
    pki = _pki(data_dir)
    rotated = pki.rotate(ca, overlap=dt.timedelta(seconds=overlap) if overlap is not None else None)
    for name in rotated:
        print(f"rotated the {name} CA: {pki.ca(name).cert.subject.rfc4514_string()}")
