"""Find and read a kubeconfig into the few facts a client needs to connect.

A kubeconfig names clusters, users and contexts; a client only needs the
server URL, how to prove who it is (a bearer token or a client certificate),
how to trust the server (CA data or file, or not at all) and the namespace the
context defaults to.  `load_kubeconfig` finds the file the way kubectl users
expect, plus Fleet's own twist: the admin kubeconfig `fleet server` writes
into its data directory, so `kfleet` works right after `fleet server` starts
with no setup.

Resolution order: the explicit path, the first existing file in
`$KUBECONFIG`, `<default data dir>/admin.kubeconfig`, then `~/.kube/config`.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ADMIN_KUBECONFIG = "admin.kubeconfig"


class KubeconfigError(Exception):
    """The kubeconfig is missing, unreadable or does not name a usable cluster."""


@dataclass(frozen=True)
class ClientConfig:
    """Everything `fleet.client.Client` needs to reach and authenticate to a server."""

    server: str
    token: str | None = None
    client_cert_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_file: str | None = None
    client_key_data: bytes | None = None
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure_skip_tls_verify: bool = False
    namespace: str = "default"
    # Whether the namespace came from the context (kubectl's "explicit" flag):
    # kept so callers can tell a context default from the fallback.
    namespace_from_context: bool = False
    context: str | None = None
    source: str | None = None  # the file the config was read from
    # A ready TLS context (CA trust + client certificate) that its owner keeps
    # current (fleet.auth.certrotation: certificates renewed, CA bundles grown during a
    # rotation); when set, `ssl_context(cfg)` returns it instead of building one.
    ssl_context: Any = field(default=None, repr=False, compare=False)


def default_data_dir() -> Path:
    """Where `fleet server` keeps its data when `--data-dir` is not given."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/fleet")
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg:
        return Path(xdg) / "fleet"
    return Path.home() / ".local" / "share" / "fleet"


def kubeconfig_candidates(path: str | None = None) -> list[Path]:
    """The files `load_kubeconfig` would consider, in order.

    An explicit path is the only candidate (a typo must fail, not silently fall
    through to another cluster).  Otherwise: each entry of `$KUBECONFIG`, the
    server's admin kubeconfig, then `~/.kube/config`.
    """
    if path:
        return [Path(path).expanduser()]
    out: list[Path] = []
    env = os.environ.get("KUBECONFIG", "")
    for part in env.split(os.pathsep):
        if part:
            out.append(Path(part).expanduser())
    out.append(default_data_dir() / ADMIN_KUBECONFIG)
    out.append(Path.home() / ".kube" / "config")
    return out


def find_kubeconfig(path: str | None = None) -> Path:
    """The first candidate file that exists; `KubeconfigError` if none does."""
    candidates = kubeconfig_candidates(path)
    for cand in candidates:
        if cand.is_file():
            return cand
    if path:
        raise KubeconfigError(f"kubeconfig {path!r} does not exist")
    tried = ", ".join(str(c) for c in candidates)
    raise KubeconfigError(
        f"no kubeconfig found (tried {tried}); start `fleet server` or pass --kubeconfig"
    )


def _named(entries: Any, name: str, what: str, source: Path) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(what)
            return body if isinstance(body, dict) else {}
    raise KubeconfigError(f"{source}: no {what} named {name!r}")


def _resolve_file(value: Any, base: Path) -> str | None:
    """kubeconfig file references are relative to the kubeconfig's own directory."""
    if not value:
        return None
    p = Path(str(value)).expanduser()
    if not p.is_absolute():
        p = base / p
    return str(p)


def _b64(value: Any) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=False)
    except ValueError as exc:
        raise KubeconfigError(f"invalid base64 data in kubeconfig: {exc}") from exc


def parse_kubeconfig(doc: dict[str, Any], *, context: str | None = None,
                     source: Path | None = None) -> ClientConfig:
    """Turn a parsed kubeconfig document into a `ClientConfig` for one context."""
    src = source or Path("<kubeconfig>")
    base = src.parent if source is not None else Path.cwd()
    ctx_name = context or doc.get("current-context")
    contexts = doc.get("contexts") or []
    ctx: dict[str, Any]
    if ctx_name:
        ctx = _named(contexts, ctx_name, "context", src)
    elif len(contexts) == 1 and isinstance(contexts[0], dict):
        ctx_name = contexts[0].get("name")
        ctx = contexts[0].get("context") or {}
    elif not contexts and len(doc.get("clusters") or []) == 1:
        # A kubeconfig with one cluster and no contexts: use it directly.
        first_cluster = doc["clusters"][0]
        users = doc.get("users") or []
        ctx = {"cluster": first_cluster.get("name"),
               "user": users[0].get("name") if users else None}
    else:
        raise KubeconfigError(f"{src}: no current-context set; pass --context")

    cluster_name = ctx.get("cluster")
    if not cluster_name:
        raise KubeconfigError(f"{src}: context {ctx_name!r} names no cluster")
    cluster = _named(doc.get("clusters"), cluster_name, "cluster", src)
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"{src}: cluster {cluster_name!r} has no server")

    user: dict[str, Any] = {}
    if ctx.get("user"):
        user = _named(doc.get("users"), ctx["user"], "user", src)

    token = user.get("token")
    token_file = _resolve_file(user.get("tokenFile"), base)
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise KubeconfigError(f"cannot read tokenFile {token_file}: {exc}") from exc

    namespace = ctx.get("namespace")
    return ClientConfig(
        server=str(server).rstrip("/"),
        token=token or None,
        client_cert_file=_resolve_file(user.get("client-certificate"), base),
        client_cert_data=_b64(user.get("client-certificate-data")),
        client_key_file=_resolve_file(user.get("client-key"), base),
        client_key_data=_b64(user.get("client-key-data")),
        ca_file=_resolve_file(cluster.get("certificate-authority"), base),
        ca_data=_b64(cluster.get("certificate-authority-data")),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        namespace=namespace or "default",
        namespace_from_context=bool(namespace),
        context=ctx_name,
        source=str(source) if source is not None else None,
    )


def load_kubeconfig(path: str | None = None, context: str | None = None) -> ClientConfig:
    """Find the kubeconfig (see the module docstring) and read one context of it."""
    found = find_kubeconfig(path)
    try:
        doc = yaml.safe_load(found.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"cannot read kubeconfig {found}: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{found}: not a kubeconfig document")
    return parse_kubeconfig(doc, context=context, source=found.resolve())
