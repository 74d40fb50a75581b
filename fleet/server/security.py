"""The server's security assembly: who may ask (authenticators), what they may do
(authorizers), the API handlers security adds, and the loops that keep it fresh.

`fleet/server/run.py` calls `build(...)` once at start and hands the pieces to the
API server; every mechanism lives in its own module under `fleet/auth/` (and
`fleet/admission/` for admission plugins) and is only *assembled* here, in
kube-apiserver's order:

* authentication (a union, first match wins): x509 client certificates, the static
  admin token (`<data-dir>/token`, kube-apiserver's --token-auth-file), bootstrap
  (join) tokens, ServiceAccount tokens, OIDC ID tokens; then anonymous if enabled;
* authorization (`--authorization-mode`, a union in order): the `system:masters`
  bypass, then Node and RBAC; or AlwaysAllow (a development server, and the
  baseline of bench/bench_security.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fleet.api.registry import Registry
from fleet.auth import (
    ADMIN,
    AllowAll,
    Authenticator,
    Authorizer,
    MastersBypass,
    TokenAuthenticator,
    UnionAuthenticator,
    UnionAuthorizer,
)
from fleet.store import Store

AUTHORIZATION_MODES = ("AlwaysAllow", "Node", "RBAC")


@dataclass
class SecurityConfig:
    """The server's security settings (flags of `fleet server`, kube-apiserver's names)."""

    # --anonymous-auth: requests without credentials are system:anonymous (RBAC then
    # lets them read only /healthz, /livez, /readyz and /version) instead of a 401.
    anonymous: bool = False
    # --authorization-mode: "AlwaysAllow", or authorizers in order ("Node,RBAC").
    authorization_mode: str = "AlwaysAllow"


@dataclass
class Security:
    """What `build` assembled, for the API server and the server's nursery."""

    authenticator: UnionAuthenticator
    authorizer: Authorizer
    # Extra resource handlers for APIServer.resource_handlers, keyed
    # (group, version, plural, subresource): resources served without storage
    # (access reviews, token reviews) and subresources such as serviceaccounts/token.
    handlers: dict[tuple[str, str, str, str], Any] = field(default_factory=dict)
    # Background loops the server runs supervised (caches fed by watches, key and
    # certificate refresh): (name, async fn taking task_status) pairs.
    tasks: list[tuple[str, Callable[..., Awaitable[None]]]] = field(default_factory=list)


def parse_authorization_mode(mode: str) -> list[str]:
    """`--authorization-mode` as a list of known mode names; ValueError otherwise."""
    modes = [m.strip() for m in mode.split(",") if m.strip()]
    if not modes:
        raise ValueError("--authorization-mode: at least one mode is required")
    bad = [m for m in modes if m not in AUTHORIZATION_MODES]
    if bad:
        raise ValueError(f"--authorization-mode: unknown mode(s) {', '.join(bad)}; "
                         f"known: {', '.join(AUTHORIZATION_MODES)}")
    if "AlwaysAllow" in modes and len(modes) > 1:
        raise ValueError("--authorization-mode: AlwaysAllow cannot be combined with other modes")
    return modes


async def build(cfg: SecurityConfig, *, data_dir: Path, store: Store, registry: Registry,
                admin_token: str) -> Security:
    """Assemble the authenticators and authorizers `cfg` asks for."""
    authenticators: list[Authenticator] = [TokenAuthenticator({admin_token: ADMIN})]
    modes = parse_authorization_mode(cfg.authorization_mode)
    authorizers: list[Authorizer] = []
    tasks: list[tuple[str, Callable[..., Awaitable[None]]]] = []
    if modes == ["AlwaysAllow"]:
        authorizers.append(AllowAll())
    else:
        authorizers.append(MastersBypass())
        # Node and RBAC authorizers are added here in `modes` order.
        for mode in modes:
            if mode == "Node":
                node_authorizer, node_task = node_authorization(store)
                authorizers.append(node_authorizer)
                tasks.append(node_task)
    return Security(UnionAuthenticator(*authenticators), UnionAuthorizer(*authorizers), tasks=tasks)


def node_authorization(store: Store) -> tuple[Authorizer, tuple[str, Callable[..., Awaitable[None]]]]:
    """`--authorization-mode Node`: the Node authorizer (fleet/auth/node.py) and the
    task feeding its graph of pods, volumes and attachments from store watches.  The
    server starts the task with `nursery.start` before it serves, so the graph has
    listed everything and no node is refused at start for an object not seen yet.
    (Its partner, the NodeRestriction admission plugin, is always in the chain.)"""
    from fleet.auth.node import GraphFeed, NodeAuthorizer

    authorizer = NodeAuthorizer()
    return authorizer, ("node-authorizer-graph", partial(GraphFeed(authorizer.graph).run, store))
