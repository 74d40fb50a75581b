"""The pure decisions of the CSR controllers: approve, sign, clean up.

* `approval(csr, req)` — kube-controller-manager's csrapproving
  (pkg/controller/certificates/approver/sarapprove.go), extended to kubelet
  serving certificates as k3s' and kubeadm's setups need:
  - `kubernetes.io/kube-apiserver-client-kubelet` requests that are a valid
    kubelet client certificate (O=system:nodes, CN=system:node:<name>, usages
    digital signature + client auth, optionally key encipherment, no SANs) are
    approved when the requester is a join token (`system:bootstrappers`) or the node
    itself renewing (username == CN);
  - `kubernetes.io/kubelet-serving` requests from a node for its own name are
    approved;
  - `kubernetes.io/kube-apiserver-client` requests from a node for its node-local
    storage provisioner (CN=system:fleet:storage-provisioner:<its name>,
    O=system:fleet:storage-provisioners, client auth, no SANs) are approved — Fleet's
    rule, the credential a provisioner DaemonSet's ServiceAccount would be;
  - a node asking for another node's name is **denied**: a compromised node must
    not obtain another's identity;
  - anything else is left for a human (`kubectl certificate approve|deny`).
* `signing(csr, req, ...)` — csrsigning: an approved, not yet issued request of a
  built-in signer is signed for min(expirationSeconds, the signing duration), or
  Failed with `SignerValidationFailure` when it does not meet its signer's rules.
* `cleanup_due(csr, now)` — csrcleaner: pending requests go after 24 hours (an
  approved one never issued counts as pending), approved-and-issued, denied and
  failed ones an hour after their condition, and any whose certificate has expired.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from fleet.api import meta
from fleet.api.kinds import certificates as c
from fleet.auth import (
    BOOTSTRAPPERS_GROUP,
    NODE_USER_PREFIX,
    NODES_GROUP,
    STORAGE_PROVISIONER_PREFIX,
    STORAGE_PROVISIONERS_GROUP,
)

APPROVE, DENY, SKIP = "approve", "deny", "skip"

KUBELET_CLIENT_REQUIRED = frozenset({"digital signature", "client auth"})
KUBELET_SERVING_REQUIRED = frozenset({"digital signature", "server auth"})
CLIENT_REQUIRED = frozenset({"client auth"})
OPTIONAL = frozenset({"key encipherment"})
CLIENT_OPTIONAL = frozenset({"digital signature", "key encipherment"})

# kube-controller-manager's --cluster-signing-duration default.
DEFAULT_SIGNING_DURATION = dt.timedelta(days=365)
# csrcleaner's durations.
PENDING_EXPIRATION = dt.timedelta(hours=24)
APPROVED_EXPIRATION = dt.timedelta(hours=1)
DENIED_EXPIRATION = dt.timedelta(hours=1)
FAILED_EXPIRATION = dt.timedelta(hours=1)


@dataclass(frozen=True)
class Verdict:
    action: str  # approve | deny | skip
    reason: str = ""
    message: str = ""


def _sans(req: x509.CertificateSigningRequest) -> x509.SubjectAlternativeName | None:
    try:
        return req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None


def _usage_problems(usages: list[str], required: frozenset[str], optional: frozenset[str]) -> list[str]:
    have = set(usages)
    out = []
    missing = sorted(required - have)
    extra = sorted(have - required - optional)
    if missing:
        out.append(f"missing required usages {missing}")
    if extra:
        out.append(f"usages not allowed {extra}")
    return out


def _node_subject_problems(req: x509.CertificateSigningRequest) -> list[str]:
    out = []
    if c.subject_orgs(req) != [NODES_GROUP]:
        out.append(f"subject organization is not {NODES_GROUP}")
    if not c.subject_cn(req).startswith(NODE_USER_PREFIX):
        out.append(f"subject common name does not begin with {NODE_USER_PREFIX}")
    return out


def _san_problems(req: x509.CertificateSigningRequest) -> list[str]:
    """A client certificate request names no subjectAltNames."""
    out = []
    sans = _sans(req)
    if sans is not None:
        for kind, label in ((x509.DNSName, "DNS"), (x509.RFC822Name, "Email"),
                            (x509.IPAddress, "IP"), (x509.UniformResourceIdentifier, "URI")):
            if sans.get_values_for_type(kind):  # type: ignore[type-var]
                out.append(f"{label} subjectAltNames are not allowed")
    return out


def kubelet_client_problems(req: x509.CertificateSigningRequest, usages: list[str]) -> list[str]:
    """Why this is not a kubelet client certificate request (IsKubeletClientCSR)."""
    return (_node_subject_problems(req) + _san_problems(req)
            + _usage_problems(usages, KUBELET_CLIENT_REQUIRED, OPTIONAL))


def kubelet_serving_problems(req: x509.CertificateSigningRequest, usages: list[str]) -> list[str]:
    """Why this is not a kubelet serving certificate request (IsKubeletServingCSR)."""
    out = _node_subject_problems(req)
    sans = _sans(req)
    dns = sans.get_values_for_type(x509.DNSName) if sans else []
    ips = sans.get_values_for_type(x509.IPAddress) if sans else []
    if not dns and not ips:
        out.append("DNS or IP subjectAltName is required")
    if sans is not None and (sans.get_values_for_type(x509.RFC822Name)
                             or sans.get_values_for_type(x509.UniformResourceIdentifier)):
        out.append("Email and URI subjectAltNames are not allowed")
    return out + _usage_problems(usages, KUBELET_SERVING_REQUIRED, OPTIONAL)


def client_problems(req: x509.CertificateSigningRequest, usages: list[str]) -> list[str]:
    """kube-apiserver-client: a client certificate, nothing else."""
    return _usage_problems(usages, CLIENT_REQUIRED, CLIENT_OPTIONAL)


def signer_problems(signer: str, req: x509.CertificateSigningRequest, usages: list[str]) -> list[str]:
    if signer == c.KUBE_APISERVER_CLIENT_KUBELET:
        return kubelet_client_problems(req, usages)
    if signer == c.KUBELET_SERVING:
        return kubelet_serving_problems(req, usages)
    if signer == c.KUBE_APISERVER_CLIENT:
        return client_problems(req, usages)
    return [f"unknown signer {signer}"]


def _spec(csr: dict[str, Any]) -> dict[str, Any]:
    spec = csr.get("spec")
    return spec if isinstance(spec, dict) else {}


def decided(csr: dict[str, Any]) -> bool:
    """Already approved, denied or failed: nothing left to decide."""
    return any(x.get("type") in (c.APPROVED, c.DENIED, c.FAILED) for x in c.conditions(csr))


def approval(csr: dict[str, Any], req: x509.CertificateSigningRequest | None) -> Verdict:
    """What the approving controller does with `csr` (its parsed request `req`)."""
    if decided(csr) or req is None:
        return Verdict(SKIP)
    spec = _spec(csr)
    signer = spec.get("signerName")
    username = str(spec.get("username") or "")
    groups = [str(g) for g in spec.get("groups") or []]
    usages = [str(u) for u in spec.get("usages") or []]
    cn = c.subject_cn(req)
    is_node = username.startswith(NODE_USER_PREFIX) and NODES_GROUP in groups
    if signer == c.KUBE_APISERVER_CLIENT_KUBELET:
        if kubelet_client_problems(req, usages):
            return Verdict(SKIP)
        if is_node and username == cn:
            return Verdict(APPROVE, "AutoApproved",
                           "Auto approving self kubelet client certificate after SubjectAccessReview.")
        if is_node:
            return _deny_other_node(username, cn)
        if BOOTSTRAPPERS_GROUP in groups:
            return Verdict(APPROVE, "AutoApproved",
                           "Auto approving kubelet client certificate after SubjectAccessReview.")
        return Verdict(SKIP)
    if signer == c.KUBELET_SERVING:
        if kubelet_serving_problems(req, usages):
            return Verdict(SKIP)
        if is_node and username == cn:
            return Verdict(APPROVE, "AutoApproved",
                           "Auto approving kubelet serving certificate after SubjectAccessReview.")
        if is_node:
            return _deny_other_node(username, cn)
        return Verdict(SKIP)
    if signer == c.KUBE_APISERVER_CLIENT and is_node and cn.startswith(STORAGE_PROVISIONER_PREFIX):
        if storage_provisioner_problems(req, usages):
            return Verdict(SKIP)
        if cn == STORAGE_PROVISIONER_PREFIX + username.removeprefix(NODE_USER_PREFIX):
            return Verdict(APPROVE, "AutoApproved",
                           "Auto approving node-local storage provisioner client certificate.")
        return _deny_other_node(username, cn)
    return Verdict(SKIP)


def storage_provisioner_problems(req: x509.CertificateSigningRequest, usages: list[str]) -> list[str]:
    """Why this is not a node-local storage provisioner's client certificate request."""
    out = []
    if c.subject_orgs(req) != [STORAGE_PROVISIONERS_GROUP]:
        out.append(f"subject organization is not {STORAGE_PROVISIONERS_GROUP}")
    return out + _san_problems(req) + _usage_problems(usages, KUBELET_CLIENT_REQUIRED, OPTIONAL)


def _deny_other_node(username: str, cn: str) -> Verdict:
    return Verdict(DENY, "AutoDenied",
                   f'node "{username}" may not request a certificate for "{cn}"')


@dataclass(frozen=True)
class SignAction:
    """Sign for `ttl`, or (when `failure` is set) mark Failed with that message."""

    usages: list[str] = field(default_factory=list)
    ttl: dt.timedelta = DEFAULT_SIGNING_DURATION
    failure: str = ""


def signing(csr: dict[str, Any], req: x509.CertificateSigningRequest | None, *,
            duration: dt.timedelta = DEFAULT_SIGNING_DURATION) -> SignAction | None:
    """What the signing controller does with `csr` (None: nothing)."""
    spec = _spec(csr)
    signer = str(spec.get("signerName") or "")
    if signer not in c.BUILTIN_SIGNERS:
        return None
    if not c.is_approved(csr) or c.is_issued(csr) or c.has_condition(csr, c.FAILED):
        return None
    if req is None:
        return SignAction(failure="unable to parse csr")
    usages = [str(u) for u in spec.get("usages") or []]
    problems = signer_problems(signer, req, usages)
    if problems:
        return SignAction(failure="; ".join(problems))
    ttl = duration
    exp = spec.get("expirationSeconds")
    if isinstance(exp, int) and exp >= c.MIN_EXPIRATION_SECONDS:
        ttl = min(ttl, dt.timedelta(seconds=exp))
    return SignAction(usages=usages, ttl=ttl)


def _condition_time(csr: dict[str, Any], ctype: str) -> dt.datetime | None:
    for x in c.conditions(csr):
        if x.get("type") == ctype:
            return meta.parse_time(x.get("lastUpdateTime")) or meta.parse_time(x.get("lastTransitionTime"))
    return None


def cleanup_due(csr: dict[str, Any], now: dt.datetime,
                cert_not_after: dt.datetime | None = None) -> dt.timedelta:
    """How long until the cleaner deletes `csr` (<= 0: now)."""
    deadlines: list[dt.datetime] = []
    if cert_not_after is not None:
        deadlines.append(cert_not_after)
    created = meta.parse_time((csr.get("metadata") or {}).get("creationTimestamp")) or now
    if c.has_condition(csr, c.DENIED):
        deadlines.append((_condition_time(csr, c.DENIED) or created) + DENIED_EXPIRATION)
    elif c.has_condition(csr, c.FAILED):
        deadlines.append((_condition_time(csr, c.FAILED) or created) + FAILED_EXPIRATION)
    elif c.is_approved(csr) and c.is_issued(csr):
        deadlines.append((_condition_time(csr, c.APPROVED) or created) + APPROVED_EXPIRATION)
    else:
        deadlines.append(created + PENDING_EXPIRATION)
    return min(deadlines) - now
