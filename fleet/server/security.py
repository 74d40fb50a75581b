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

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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
from fleet.auth.certrotation import CertRotator
from fleet.auth.pki import ClusterPKI
from fleet.auth.x509 import X509Authenticator
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
    # PKI (fleet/auth/pki.py): leaf certificate lifetime in seconds (None: 365 days;
    # tests use seconds to watch renewals), and how often the renewal loop looks
    # (None: a twentieth of the lifetime, between 0.5 and 30 seconds).
    cert_lifetime: float | None = None
    cert_check_interval: float | None = None


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
    # The cluster PKI and its renewal loop (also in `tasks`): run.py registers the
    # serving certificate, the admin kubeconfig and the components' contexts with it.
    pki: ClusterPKI | None = None
    certs: CertRotator | None = None


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


def open_pki(cfg: SecurityConfig, data_dir: Path) -> ClusterPKI:
    """The cluster PKI of `data_dir` with the configured leaf lifetime (not loaded yet)."""
    lifetime = dt.timedelta(seconds=cfg.cert_lifetime) if cfg.cert_lifetime else None
    return ClusterPKI(data_dir, leaf_lifetime=lifetime)


async def build(cfg: SecurityConfig, *, data_dir: Path, store: Store, registry: Registry,
                admin_token: str, pki: ClusterPKI | None = None) -> Security:
    """Assemble the authenticators and authorizers `cfg` asks for."""
    authenticators: list[Authenticator] = [TokenAuthenticator({admin_token: ADMIN})]
    tasks: list[tuple[str, Callable[..., Awaitable[None]]]] = []
    # --- pki: x509 client certificates first (kube-apiserver's order), verified
    # against the client CA bundle as it is now; the certificate renewal loop.
    if pki is None:
        pki = open_pki(cfg, data_dir)
        pki.refresh()
    certs = CertRotator(pki, cfg.cert_check_interval)
    authenticators.insert(0, X509Authenticator(pki.client_ca_bundle))
    tasks.append(("cert-rotation", certs.run))
    modes = parse_authorization_mode(cfg.authorization_mode)
    authorizers: list[Authorizer] = []
    if modes == ["AlwaysAllow"]:
        authorizers.append(AllowAll())
    else:
        authorizers.append(MastersBypass())
        # Node and RBAC authorizers are added here in `modes` order.
    return Security(UnionAuthenticator(*authenticators), UnionAuthorizer(*authorizers),
                    tasks=tasks, pki=pki, certs=certs)
