"""`certificates.k8s.io/v1` CertificateSigningRequest: a request for a certificate
from one of the cluster's signers.

As kube-apiserver 1.32 (pkg/registry/certificates/certificates/strategy.go and
pkg/apis/certificates/validation):

* create (`prepare_create`): the requester's username, uid, groups and extra are
  stamped into `spec` from the authenticated user — whatever the client sent
  there is replaced, so approvers can trust who asked; `status` is dropped;
* the main resource changes only metadata: spec and status come from the stored
  object (`prepare_update`);
* `/status` (the signer) may set `status.certificate` and Failed conditions, never
  add or drop Approved/Denied; `/approval` (`kubectl certificate approve|deny`)
  changes only the conditions (the CSRApproval admission plugin,
  fleet/admission/certificates.py, checks verb `approve` on `signers`);
* validation: `spec.request` a PEM CERTIFICATE REQUEST, `signerName` a qualified
  name, known and unique usages, expirationSeconds >= 600, conditions of known
  types, True-only for Approved/Denied/Failed, Approved and Denied exclusive, and
  an issued certificate never changes.

Columns are kubectl's: NAME AGE SIGNERNAME REQUESTOR REQUESTEDDURATION CONDITION.
The helpers here (PEM parsing, conditions, the built-in signers' rules) are what
the CSR controllers (fleet/controllers/csr*.py) and the agent share.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.kinds._common import col, d, lst
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, KindInfo

Cause = dict[str, str]

GROUP = "certificates.k8s.io"

KUBE_APISERVER_CLIENT = "kubernetes.io/kube-apiserver-client"
KUBE_APISERVER_CLIENT_KUBELET = "kubernetes.io/kube-apiserver-client-kubelet"
KUBELET_SERVING = "kubernetes.io/kubelet-serving"
LEGACY_UNKNOWN = "kubernetes.io/legacy-unknown"
BUILTIN_SIGNERS = (KUBE_APISERVER_CLIENT, KUBE_APISERVER_CLIENT_KUBELET, KUBELET_SERVING)

APPROVED, DENIED, FAILED = "Approved", "Denied", "Failed"
CONDITION_TYPES = (APPROVED, DENIED, FAILED)

KEY_USAGES = (
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
)
MIN_EXPIRATION_SECONDS = 600


# ------------------------------------------------------------------------------ helpers


def request_pem(csr: dict[str, Any]) -> bytes:
    """spec.request decoded from its base64 (b"" when absent or not base64)."""
    raw = d(csr, "spec").get("request")
    if not isinstance(raw, str):
        return b""
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return b""


def parse_request(pem: bytes) -> x509.CertificateSigningRequest:
    """The x509 request in `pem`; ValueError in kube's words when it is none."""
    text = pem.decode("latin-1")
    begin = "-----BEGIN "
    if begin not in text:
        raise ValueError("PEM block type must be CERTIFICATE REQUEST")
    kind = text[text.index(begin) + len(begin):].split("-----", 1)[0]
    if kind != "CERTIFICATE REQUEST":
        raise ValueError("PEM block type must be CERTIFICATE REQUEST")
    try:
        req = x509.load_pem_x509_csr(pem)
    except ValueError as e:
        raise ValueError(f"x509: {e}") from None
    if not req.is_signature_valid:
        raise ValueError("x509: signature of the certificate request is not valid")
    return req


def conditions(csr: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in lst(csr, "status", "conditions") if isinstance(c, dict)]


def has_condition(csr: dict[str, Any], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status", "True") == "True" for c in conditions(csr))


def is_approved(csr: dict[str, Any]) -> bool:
    return has_condition(csr, APPROVED) and not has_condition(csr, DENIED)


def is_issued(csr: dict[str, Any]) -> bool:
    return bool(d(csr, "status").get("certificate"))


def certificate_pem(csr: dict[str, Any]) -> bytes:
    raw = d(csr, "status").get("certificate")
    try:
        return base64.b64decode(raw) if isinstance(raw, str) else b""
    except ValueError:
        return b""


def condition(ctype: str, reason: str, message: str) -> dict[str, Any]:
    now = meta.now_rfc3339()
    return {"type": ctype, "status": "True", "reason": reason, "message": message,
            "lastUpdateTime": now, "lastTransitionTime": now}


def subject_cn(req: x509.CertificateSigningRequest) -> str:
    cns = req.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else ""


def subject_orgs(req: x509.CertificateSigningRequest) -> list[str]:
    return [str(a.value) for a in req.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)]


def public_key_der(req: x509.CertificateSigningRequest) -> bytes:
    return req.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


# --------------------------------------------------------------------------- strategy


def prepare_create(obj: dict[str, Any], user: Any) -> None:
    """PrepareForCreate: the requester, from the request's user; no status."""
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        for f in ("username", "uid", "groups", "extra"):
            spec.pop(f, None)
        if user is not None:
            spec["username"] = user.name
            if user.uid:
                spec["uid"] = user.uid
            if user.groups:
                spec["groups"] = list(user.groups)
            if user.extra:
                spec["extra"] = {k: list(vs) for k, vs in user.extra.items()}
    obj.pop("status", None)


def prepare_update(new: dict[str, Any], old: dict[str, Any]) -> None:
    """The main resource: only metadata may change."""
    for f in ("spec", "status"):
        if f in old:
            new[f] = copy.deepcopy(old[f])
        else:
            new.pop(f, None)


def _populate_timestamps(new: dict[str, Any], old: dict[str, Any]) -> None:
    """populateConditionTimestamps: a new or changed condition gets lastUpdateTime now;
    lastTransitionTime now when its status changed (else the old one)."""
    now = meta.now_rfc3339()
    olds = {c.get("type"): c for c in conditions(old)}
    for c in conditions(new):
        prev = olds.get(c.get("type"))
        if not c.get("lastUpdateTime"):
            c["lastUpdateTime"] = now
        if not c.get("lastTransitionTime"):
            if prev is not None and prev.get("status") == c.get("status") and prev.get("lastTransitionTime"):
                c["lastTransitionTime"] = prev["lastTransitionTime"]
            else:
                c["lastTransitionTime"] = now


def prepare_status_update(new: dict[str, Any], old: dict[str, Any]) -> None:
    """The signer's /status: spec kept; Approved/Denied conditions as they were."""
    if "spec" in old:
        new["spec"] = copy.deepcopy(old["spec"])
    status = new.setdefault("status", {})
    if not isinstance(status, dict):
        return
    kept = [c for c in conditions(old) if c.get("type") in (APPROVED, DENIED)]
    others = [c for c in conditions(new) if c.get("type") not in (APPROVED, DENIED)]
    status["conditions"] = kept + others
    if not status["conditions"]:
        status.pop("conditions")
    _populate_timestamps(new, old)


def prepare_approval_update(new: dict[str, Any], old: dict[str, Any]) -> None:
    """/approval: only the conditions change; spec and the certificate are kept."""
    if "spec" in old:
        new["spec"] = copy.deepcopy(old["spec"])
    status = new.setdefault("status", {})
    if not isinstance(status, dict):
        return
    cert = d(old, "status").get("certificate")
    if cert:
        status["certificate"] = cert
    else:
        status.pop("certificate", None)
    _populate_timestamps(new, old)


# ------------------------------------------------------------------------- validation


def validate_csr(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*out, v.required("spec")]
    raw = spec.get("request")
    if not raw:
        out.append(v.required("spec.request"))
    else:
        try:
            parse_request(request_pem(obj))
        except ValueError as e:
            out.append(v.invalid("spec.request", "<request>", str(e)))
    usages = spec.get("usages")
    if not usages:
        out.append(v.required("spec.usages"))
    seen: set[str] = set()
    for i, u in enumerate(usages if isinstance(usages, list) else []):
        if u not in KEY_USAGES:
            out.append(v.not_supported(f"spec.usages[{i}]", u, KEY_USAGES))
        elif u in seen:
            out.append(v.duplicate(f"spec.usages[{i}]", u))
        seen.add(str(u))
    signer = spec.get("signerName")
    if not signer:
        out.append(v.required("spec.signerName"))
    elif signer == LEGACY_UNKNOWN:
        out.append(v.invalid("spec.signerName", signer, "the legacy signerName is not allowed via this API version"))
    else:
        out += _signer_name_errors(str(signer))
    exp = spec.get("expirationSeconds")
    if isinstance(exp, int) and exp < MIN_EXPIRATION_SECONDS:
        out.append(v.invalid("spec.expirationSeconds", exp,
                             "may not specify a duration less than 600 seconds (10 minutes)"))
    out += _conditions_errors(obj)
    cert = d(obj, "status").get("certificate")
    if cert:
        out += _certificate_errors(obj)
    if old is not None:
        old_cert = d(old, "status").get("certificate")
        if old_cert and cert != old_cert:
            out.append(v.forbidden("status.certificate", "updates may not modify existing certificate content"))
        if (old.get("spec") or {}) != (obj.get("spec") or {}):
            out.append(v.forbidden("spec", "field is immutable"))
    return out


def _signer_name_errors(signer: str) -> list[Cause]:
    """ValidateSignerName: `<domain>/<path>`, a DNS subdomain then a path."""
    domain, sep, path = signer.partition("/")
    if not sep:
        return [v.invalid("spec.signerName", signer, "must be a fully qualified domain and path of the form "
                          "'example.com/signer-name'")]
    out = [v.invalid("spec.signerName", signer, m) for m in v.is_dns1123_subdomain(domain)]
    if not path:
        out.append(v.invalid("spec.signerName", signer, "validating path: path may not be empty"))
    return out


def _conditions_errors(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    seen: set[str] = set()
    approved = denied = False
    for i, c in enumerate(conditions(obj)):
        ctype, status = c.get("type"), c.get("status", "True")
        if not ctype:
            out.append(v.required(f"status.conditions[{i}].type"))
        elif ctype in seen:
            out.append(v.duplicate(f"status.conditions[{i}].type", ctype))
        seen.add(str(ctype))
        allowed = ("True",) if ctype in CONDITION_TYPES else ("True", "False", "Unknown")
        if status not in allowed:
            out.append(v.not_supported(f"status.conditions[{i}].status", status, allowed))
        if ctype == APPROVED:
            approved = True
            if denied:
                out.append(v.invalid("status.conditions", APPROVED,
                                     "Approved and Denied conditions are mutually exclusive"))
        if ctype == DENIED:
            denied = True
            if approved:
                out.append(v.invalid("status.conditions", DENIED,
                                     "Approved and Denied conditions are mutually exclusive"))
    return out


def _certificate_errors(obj: dict[str, Any]) -> list[Cause]:
    pem = certificate_pem(obj)
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        return [v.invalid("status.certificate", "<certificate data>", str(e))]
    if not certs:
        return [v.invalid("status.certificate", "<certificate data>", "must contain at least one CERTIFICATE PEM block")]
    return []


# ------------------------------------------------------------------------------ table


def _requestor(o: dict[str, Any]) -> str:
    return str(d(o, "spec").get("username") or "")


def _duration(o: dict[str, Any]) -> str:
    exp = d(o, "spec").get("expirationSeconds")
    return meta.human_duration(exp) if isinstance(exp, int) else "<none>"


def condition_cell(o: dict[str, Any]) -> str:
    """kubectl's CONDITION: the condition types joined (Approved,Issued), or Pending."""
    types = [str(c.get("type")) for c in conditions(o) if c.get("type")]
    if is_issued(o):
        types.append("Issued")
    return ",".join(types) or "Pending"


CSR = KindInfo(
    zero_status={},
    group=GROUP, version="v1", kind="CertificateSigningRequest", plural="certificatesigningrequests",
    singular="certificatesigningrequest", namespaced=False, short_names=("csr",),
    subresources=("status", "approval"),
    columns_override=(
        NAME_COLUMN, AGE_COLUMN,
        col("SignerName", lambda o: str(d(o, "spec").get("signerName") or "")),
        col("Requestor", _requestor),
        col("RequestedDuration", _duration),
        col("Condition", condition_cell),
    ),
    validate=validate_csr,
    selectable_fields=("spec.signerName",),
    prepare_create=prepare_create,
    prepare_update=prepare_update,
    prepare_status_update=prepare_status_update,
    prepare_approval_update=prepare_approval_update,
)

KINDS = (CSR,)
