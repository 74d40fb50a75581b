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
  baseline of bench/bench_security.py);
* audit (`--audit-log-path`, `--audit-policy-file`; fleet/auth/audit.py): the
  policy and the log, whose writer loop is one of `tasks`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fleet.admission import AdmissionChain
from fleet.admission import certificates as certificate_admission
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
    bootstrap,
)
from fleet.auth.audit import Auditor, auditor_from_flags
from fleet.auth.certrotation import CertRotator
from fleet.auth.oidc import OIDCAuthenticator, OIDCConfig
from fleet.auth.pki import ClusterPKI
from fleet.auth.reviews import AllowAllRules, UnionRuleResolver, resolvers_of
from fleet.auth.reviews import handlers as review_handlers
from fleet.auth.serviceaccount import (
    KeyFiles,
    ServiceAccountConfig,
    ServiceAccountTokenAuthenticator,
    TokenIssuer,
    load_or_create_keys,
    store_getter,
)
from fleet.auth.x509 import X509Authenticator
from fleet.server.tokenapi import TokenAPI
from fleet.store import Store

AUTHORIZATION_MODES = ("AlwaysAllow", "Node", "RBAC")


@dataclass
class SecurityConfig:
    """The server's security settings (flags of `fleet server`, kube-apiserver's names)."""

    # --anonymous-auth: requests without credentials are system:anonymous (RBAC then
    # lets them read only /healthz, /livez, /readyz and /version) instead of a 401.
    anonymous: bool = False
    # --authorization-mode: "AlwaysAllow", or authorizers in order ("Node,RBAC").
    authorization_mode: str = "Node,RBAC"
    # ServiceAccount tokens (--service-account-*, --api-audiences) and OIDC users (--oidc-*;
    # None: no OIDC provider).
    service_accounts: ServiceAccountConfig = field(default_factory=ServiceAccountConfig)
    oidc: OIDCConfig | None = None
    # Audit (fleet/auth/audit.py): --audit-log-path (unset: off; "-": stdout),
    # --audit-policy-file (unset: Metadata for every request), and the rotation of the
    # file: --audit-log-maxsize MB (0: 100), --audit-log-maxage days and
    # --audit-log-maxbackup files (0: keep all).
    audit_log_path: str = ""
    audit_policy_file: str = ""
    audit_log_maxsize: int = 0
    audit_log_maxage: int = 0
    audit_log_maxbackup: int = 0
    # --pod-security-config: PodSecurity admission's PodSecurityConfiguration (defaults
    # for namespaces without labels, exemptions; fleet/admission/podsecurity.py).
    # Unset: privileged everywhere unless a namespace's labels say otherwise.
    pod_security_config: str = ""
    # --enable-bootstrap-token-auth: join tokens (kube-system/bootstrap-token-*
    # Secrets) authenticate as system:bootstrap:<id> (fleet/auth/bootstrap.py).
    bootstrap_tokens: bool = True
    # PKI (fleet/auth/pki.py): leaf certificate lifetime in seconds (None: 365 days;
    # tests use seconds to watch renewals), and how often the renewal loop looks
    # (None: a twentieth of the lifetime, between 0.5 and 30 seconds).
    cert_lifetime: float | None = None
    cert_check_interval: float | None = None
    # The ProcessControl consent gate (fleet/server/processcontrol.py): on with
    # --hardened or --process-control-consent; off by default (RBAC alone decides
    # exec/attach/port-forward/signal, as in Kubernetes).
    process_control_consent: bool = False


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
    # Validating admission plugins security adds, run first in the chain (RBAC
    # escalation prevention).
    validating_admission: list[Any] = field(default_factory=list)
    # The RBAC authorizer when RBAC is on: also the rule resolver (SelfSubjectRulesReview).
    rbac: Any = None
    # Non-resource paths served by a handler, for APIServer.path_handlers: path ->
    # async fn(req) -> Resp (the ServiceAccount issuer's OIDC discovery and JWKS).
    paths: dict[str, Any] = field(default_factory=dict)
    # The audit trail (policy + log) for APIServer(audit=...); None: audit off.
    audit: Auditor | None = None
    # Handlers that run the server's admission chain (TokenRequest), given it by
    # `set_admission` once the chain is built (the chain itself needs `handlers`).
    admitting: list[Any] = field(default_factory=list)

    def set_admission(self, admission: AdmissionChain) -> None:
        for h in self.admitting:
            h.admission = admission
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
                admin_token: str, admission: AdmissionChain | None = None,
                pki: ClusterPKI | None = None) -> Security:
    """Assemble the authenticators and authorizers `cfg` asks for.  `admission` is the
    server's chain, for the requests security's own handlers serve (TokenRequests)."""
    authenticators: list[Authenticator] = [TokenAuthenticator({admin_token: ADMIN})]
    handlers: dict[tuple[str, str, str, str], Any] = {}
    tasks: list[tuple[str, Callable[..., Awaitable[None]]]] = []
    paths: dict[str, Any] = {}

    # ServiceAccount tokens, OIDC ID tokens; TokenRequest, TokenReview, SelfSubjectReview,
    # the issuer's OIDC discovery (fleet/auth/serviceaccount.py, fleet/auth/oidc.py,
    # fleet/server/tokenapi.py).
    sa_cfg = cfg.service_accounts
    sa_keys = load_or_create_keys(data_dir / "tls", signing_key_file=sa_cfg.signing_key_file,
                                  extra_key_files=sa_cfg.key_files)
    key_files = KeyFiles(sa_keys, data_dir / "tls", signing_key_file=sa_cfg.signing_key_file,
                         extra_key_files=sa_cfg.key_files)
    tasks.append(("service-account-keys", key_files.run))
    get = store_getter(store)
    authenticators.append(ServiceAccountTokenAuthenticator(sa_keys, get, issuers=sa_cfg.issuers,
                                                           api_audiences=sa_cfg.audiences))
    if cfg.oidc is not None:
        oidc = OIDCAuthenticator(cfg.oidc)
        authenticators.append(oidc)
        tasks.append(("oidc-keys", oidc.run))
    token_api = TokenAPI(TokenIssuer(sa_keys, sa_cfg.issuers[0]), get, None, api_audiences=sa_cfg.audiences,
                         max_expiration_seconds=sa_cfg.max_token_expiration,
                         extend_expiration=sa_cfg.extend_token_expiration, jwks_uri=sa_cfg.jwks_uri,
                         admission=admission)
    handlers.update(token_api.handlers())
    admitting = [token_api]
    paths.update(token_api.paths())

    if cfg.bootstrap_tokens:
        # Join tokens: kube-system Secrets from a watch-fed cache (store read on a miss).
        secrets = bootstrap.SecretSource(store)
        authenticators.append(bootstrap.BootstrapTokenAuthenticator(secrets))
        tasks.append(("bootstrap-token-cache", secrets.run))

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
    sec = Security(UnionAuthenticator(), UnionAuthorizer(), handlers, tasks, paths=paths, admitting=admitting)
    if modes == ["AlwaysAllow"]:
        authorizers.append(AllowAll())
    else:
        authorizers.append(MastersBypass())
        # Node and RBAC authorizers are added here in `modes` order.
        for mode in modes:
            if mode == "Node":
                node_authorizer, node_task = node_authorization(store)
                authorizers.append(node_authorizer)
                sec.tasks.append(node_task)
            if mode == "RBAC":
                authorizers.append(_rbac(sec, store))
    assert isinstance(sec.authorizer, UnionAuthorizer)
    sec.authorizer.authorizers = authorizers

    # -- reviews: authorization.k8s.io/v1 access reviews (fleet/auth/reviews.py), answered
    # by the authorizer above; SelfSubjectRulesReview lists the rules of every authorizer
    # that can enumerate them (RBAC's `rules_for`; AlwaysAllow's are `*`), and shows a
    # system:masters user the `*` rules.
    resolvers = [AllowAllRules()] if modes == ["AlwaysAllow"] else resolvers_of(authorizers)
    sec.handlers.update(review_handlers(sec.authorizer, UnionRuleResolver(*resolvers)))
    # CSR approval and signing need the authorizer (fleet/admission/certificates.py).
    sec.validating_admission.extend(certificate_admission.plugins(sec.authorizer))

    # Audit: a bad policy or an unwritable log path raises here, before the API listens.
    sec.audit = auditor_from_flags(cfg.audit_log_path, cfg.audit_policy_file,
                                   max_size_mb=cfg.audit_log_maxsize, max_age_days=cfg.audit_log_maxage,
                                   max_backups=cfg.audit_log_maxbackup)
    if sec.audit is not None:
        sec.tasks.append(("audit-log", sec.audit.sink.run))

    sec.pki, sec.certs = pki, certs
    sec.authenticator.authenticators = authenticators
    token_api.authenticator = sec.authenticator  # a TokenReview asks every authenticator
    return sec


def _rbac(sec: Security, store: Store) -> Authorizer:
    """RBAC: the authorizer over its watch-fed caches (a supervised task), and
    escalation prevention as the first validating admission plugin.  The default
    roles and bindings are reconciled at start by run.py (bootstrap_policy)."""
    from fleet.auth.escalation import RBACEscalation
    from fleet.auth.rbac import RBACAuthorizer

    rbac = RBACAuthorizer()
    sec.rbac = rbac
    sec.tasks.append(("rbac-cache", partial(rbac.run, store)))
    # Escalation asks the whole union (`escalate`/`bind` may come from any authorizer).
    sec.validating_admission.append(RBACEscalation(sec.authorizer, rbac))
    return rbac


def node_authorization(store: Store) -> tuple[Authorizer, tuple[str, Callable[..., Awaitable[None]]]]:
    """`--authorization-mode Node`: the Node authorizer (fleet/auth/node.py) and the
    task feeding its graph of pods, volumes and attachments from store watches.  The
    server starts the task with `nursery.start` before it serves, so the graph has
    listed everything and no node is refused at start for an object not seen yet.
    (Its partner, the NodeRestriction admission plugin, is always in the chain.)"""
    from fleet.auth.node import GraphFeed, NodeAuthorizer

    authorizer = NodeAuthorizer()
    return authorizer, ("node-authorizer-graph", partial(GraphFeed(authorizer.graph).run, store))
