"""`fleet token create|list|delete`: bootstrap (join) tokens, as `kubeadm token`.

Tokens are Secrets `kube-system/bootstrap-token-<id>` (fleet/auth/bootstrap.py),
written through the API with the admin kubeconfig (or --kubeconfig), so the API's
authorization applies.  `create` prints the token a new node passes to
`fleet agent --server URL --token <token>`; `delete` revokes it at once.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import Annotated

import cyclopts
import trio

app = cyclopts.App(name="token", help="Manage bootstrap (join) tokens.")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def parse_duration(text: str) -> dt.timedelta:
    """A Go duration (`24h`, `1h30m`, `90s`; `0` = never expires)."""
    text = text.strip()
    if text in ("0", "0s"):
        return dt.timedelta(0)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1}[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f'invalid duration "{text}" (e.g. 24h, 30m, 1h30m; 0 never expires)')
    return dt.timedelta(seconds=total)


def _short_duration(td: dt.timedelta) -> str:
    s = int(td.total_seconds())
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 48 * 3600:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def list_rows(secrets: list[dict], now: dt.datetime) -> list[list[str]]:
    """`kubeadm token list`'s rows: TOKEN TTL EXPIRES USAGES DESCRIPTION EXTRA GROUPS."""
    from fleet.auth import bootstrap

    rows = []
    for s in secrets:
        info = bootstrap.token_info(s)
        if info is None:
            continue
        if info.expires is None:
            ttl, expires = "<forever>", "<never>"
        else:
            ttl, expires = _short_duration(info.expires - now), bootstrap.format_time(info.expires)
        rows.append([f"{info.token_id}.{info.token_secret}", ttl, expires, ",".join(info.usages) or "<none>",
                     info.description or "<none>", ",".join(info.groups) or "<none>"])
    return rows


def _client(kubeconfig: str | None):  # type: ignore[no-untyped-def]
    from fleet.client import Client, KubeconfigError, load_kubeconfig

    try:
        return Client(load_kubeconfig(kubeconfig), user_agent="fleet-token")
    except KubeconfigError as e:
        sys.exit(f"fleet token: {e}")


def _fail(e: Exception) -> None:
    sys.exit(f"fleet token: {e}")


@app.command
def create(
    token: Annotated[str | None, cyclopts.Parameter(help="The token to create (default: a random one).")] = None,
    *,
    ttl: Annotated[str, cyclopts.Parameter(help="How long the token is valid (0: forever).")] = "24h",
    description: Annotated[str, cyclopts.Parameter(help="A human-readable note.")] = "",
    usages: Annotated[str, cyclopts.Parameter(
        help="Comma-separated: authentication (join), signing (sign cluster-info).")] = "signing,authentication",
    groups: Annotated[str, cyclopts.Parameter(
        help="Extra groups (system:bootstrappers:*) the token authenticates as.")]
        = "system:bootstrappers:kubeadm:default-node-token",
    kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Admin kubeconfig.")] = None,
) -> None:
    """Create a bootstrap token and print it."""
    from fleet.auth import bootstrap
    from fleet.client import ApiException

    try:
        duration = parse_duration(ttl)
        value = token or bootstrap.generate_token()
        secret = bootstrap.token_secret(
            value, ttl=duration or None, description=description,
            usages=[u.strip() for u in usages.split(",") if u.strip()],
            groups=[g.strip() for g in groups.split(",") if g.strip()])
    except ValueError as e:
        _fail(e)
        return

    async def main() -> None:
        async with _client(kubeconfig) as c:
            await c.create("v1", "secrets", secret, bootstrap.NAMESPACE)

    try:
        trio.run(main)
    except ApiException as e:
        _fail(e)
    print(value)


@app.command(name="list")
def list_(*, kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Admin kubeconfig.")] = None) -> None:
    """List bootstrap tokens (kubeadm's columns)."""
    from fleet.auth import bootstrap
    from fleet.client import ApiException

    async def main() -> list[dict]:
        async with _client(kubeconfig) as c:
            res = await c.list("v1", "secrets", bootstrap.NAMESPACE,
                               field_selector=f"type={bootstrap.SECRET_TYPE}")
            return list(res.get("items") or [])

    try:
        items = trio.run(main)
    except ApiException as e:
        _fail(e)
        return
    rows = [["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA GROUPS"],
            *list_rows(items, dt.datetime.now(dt.UTC))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


@app.command
def delete(
    tokens: Annotated[list[str], cyclopts.Parameter(help="Token ids or whole tokens.")],
    *,
    kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Admin kubeconfig.")] = None,
) -> None:
    """Delete (revoke) bootstrap tokens."""
    from fleet.auth import bootstrap
    from fleet.client import ApiException

    ids = []
    for t in tokens:
        parsed = bootstrap.parse_token(t)
        tid = parsed[0] if parsed else t
        if not bootstrap.TOKEN_ID_RE.match(tid):
            _fail(ValueError(f'given token "{t}" didn\'t match pattern "{bootstrap.TOKEN_ID_RE.pattern}" '
                             f'or "{bootstrap.TOKEN_RE.pattern}"'))
        ids.append(tid)

    async def main() -> None:
        async with _client(kubeconfig) as c:
            for tid in ids:
                await c.delete("v1", "secrets", bootstrap.secret_name(tid), bootstrap.NAMESPACE)
                print(f'bootstrap token "{tid}" deleted')

    try:
        trio.run(main)
    except ApiException as e:
        _fail(e)
