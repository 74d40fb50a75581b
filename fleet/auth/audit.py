"""The audit trail: kube-apiserver's audit.k8s.io/v1 policy and events.

Who did what, when, and with which outcome — one `Event` per request stage, in
exactly the shape kube-apiserver writes (`kind: Event`, `apiVersion:
audit.k8s.io/v1`), so tools that read a Kubernetes audit log read Fleet's.

This module owns the *decisions*: which level a request is audited at (the
`Policy` file of `--audit-policy-file`, rules in order, the first match wins,
kube-apiserver's `policy/checker.go`), and what each event holds at that level
(`RequestAudit`, one per request).  Where the lines go (a rotated file, stdout)
is fleet/auth/audit_log.py; the API server calls the hooks (fleet/server/app.py, access.py, connect.py).

Three rules that no policy can loosen:

* Secrets are never logged beyond `Metadata`: core `secrets`,
  `serviceaccounts/token` (a TokenRequest's response *is* a token) and
  `authentication.k8s.io` `tokenreviews` (the request carries one) are capped at
  Metadata whatever level the policy asks for, and any request or response body
  that turns out to hold such an object is dropped (`SECRET_KINDS`).
* A 401 is audited (user `{}`, the response's status) with why the credentials
  were refused in the `authentication.fleet.dev/failure-reason` annotation —
  the client only ever reads "Unauthorized".
* Without a policy file every request is audited at Metadata, RequestReceived
  omitted: one line per request (two more stages only for long-running ones).
  kube-apiserver audits nothing without a policy; Fleet's `--audit-log-path`
  alone is enough to get a useful trail.

The per-request context travels in a `ContextVar` (`CURRENT`) so the places that
learn something mid-request (authentication failure reasons, the authorizer's
decision, impersonation) record it without threading a parameter through every
handler; with audit off it is always None and each hook is one `get()`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from fleet.api import protobuf
from fleet.auth import Attributes, Decision, UserInfo

log = logging.getLogger(__name__)

API_VERSION = "audit.k8s.io/v1"

# Levels in increasing order of detail (audit.k8s.io/v1 Level).
NONE, METADATA, REQUEST, REQUEST_RESPONSE = "None", "Metadata", "Request", "RequestResponse"
LEVELS = (NONE, METADATA, REQUEST, REQUEST_RESPONSE)
_RANK = {lvl: i for i, lvl in enumerate(LEVELS)}

# Stages (audit.k8s.io/v1 Stage).
REQUEST_RECEIVED = "RequestReceived"
RESPONSE_STARTED = "ResponseStarted"
RESPONSE_COMPLETE = "ResponseComplete"
PANIC = "Panic"
STAGES = (REQUEST_RECEIVED, RESPONSE_STARTED, RESPONSE_COMPLETE, PANIC)

# Annotations kube-apiserver's authorization filter adds to every authorized request.
DECISION_ANNOTATION = "authorization.k8s.io/decision"
REASON_ANNOTATION = "authorization.k8s.io/reason"
# Why credentials were refused (kube-apiserver only logs it; Fleet puts it on the event).
AUTHN_FAILURE_ANNOTATION = "authentication.fleet.dev/failure-reason"

# (group, resource incl. subresource) whose bodies hold secret data: never beyond Metadata.
SECRET_RESOURCES = frozenset({("", "secrets"), ("", "serviceaccounts/token"),
                              ("authentication.k8s.io", "tokenreviews")})
# Kinds that are dropped from request/response bodies wherever they turn up.
SECRET_KINDS = frozenset({"Secret", "SecretList", "TokenRequest", "TokenReview"})

# The request header a client may set to choose the audit ID (kube-apiserver honours it),
# and the response header the ID is returned in.
AUDIT_ID_HEADER = "audit-id"
AUDIT_ID_RESPONSE_HEADER = "Audit-Id"


class PolicyError(ValueError):
    """The policy file cannot be used: the server must not start with it."""


# ---------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class GroupResources:
    group: str = ""
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyRule:
    level: str
    users: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    resources: tuple[GroupResources, ...] = ()
    namespaces: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()
    omit_stages: frozenset[str] = frozenset()  # already the union with the policy's
    omit_managed_fields: bool | None = None

    def matches(self, user: UserInfo | None, attrs: Attributes) -> bool:
        """kube-apiserver's `ruleMatches` (policy/checker.go)."""
        if self.users and (user is None or user.name not in self.users):
            return False
        if self.user_groups and (user is None or not any(g in self.user_groups for g in user.groups)):
            return False
        if self.verbs and attrs.verb not in self.verbs:
            return False
        if self.namespaces or self.resources:
            return self._matches_resource(attrs)
        if self.non_resource_urls:
            return not attrs.resource_request and any(
                _path_matches(attrs.path, spec) for spec in self.non_resource_urls)
        return True

    def _matches_resource(self, attrs: Attributes) -> bool:
        if not attrs.resource_request:
            return False
        if self.namespaces and attrs.namespace not in self.namespaces:  # "" = cluster-scoped
            return False
        if not self.resources:
            return True
        sub = attrs.subresource
        combined = f"{attrs.resource}/{sub}" if sub else attrs.resource
        for gr in self.resources:
            if gr.group != attrs.group:
                continue
            if not gr.resources:
                return True
            if gr.resource_names and attrs.name not in gr.resource_names:
                continue
            for res in gr.resources:
                if res in (combined, "*"):
                    return True
                if sub and res.startswith("*/") and res[2:] == sub:  # "*/scale"
                    return True
                if res.endswith("/*") and res[:-2] == attrs.resource:  # "pods/*"
                    return True
        return False


def _path_matches(path: str, spec: str) -> bool:
    if spec in ("*", path):
        return True
    return spec.endswith("*") and path.startswith(spec.rstrip("*"))


@dataclass(frozen=True)
class AuditConfig:
    """What the policy decided for one request (kube's RequestAuditConfig)."""

    level: str
    omit_stages: frozenset[str] = frozenset()
    omit_managed_fields: bool = False


@dataclass(frozen=True)
class Policy:
    rules: tuple[PolicyRule, ...]
    omit_stages: frozenset[str] = frozenset()
    omit_managed_fields: bool = False

    def evaluate(self, user: UserInfo | None, attrs: Attributes) -> AuditConfig:
        """The first matching rule's level (None when no rule matches, as
        kube-apiserver), capped at Metadata for resources holding secrets."""
        for rule in self.rules:
            if rule.matches(user, attrs):
                mf = self.omit_managed_fields if rule.omit_managed_fields is None \
                    else rule.omit_managed_fields
                return AuditConfig(cap_level(rule.level, attrs), rule.omit_stages, mf)
        return AuditConfig(NONE, self.omit_stages, self.omit_managed_fields)


def cap_level(level: str, attrs: Attributes) -> str:
    """`level`, but never beyond Metadata for a resource that holds secret data."""
    if _RANK[level] > _RANK[METADATA] and attrs.resource_request:
        res = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        if (attrs.group, res) in SECRET_RESOURCES:
            return METADATA
    return level


# Without a policy file: every request at Metadata, one line each (RequestReceived omitted).
DEFAULT_POLICY = Policy((PolicyRule(METADATA, omit_stages=frozenset({REQUEST_RECEIVED})),),
                        frozenset({REQUEST_RECEIVED}))

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_POLICY_FIELDS = {"apiVersion", "kind", "metadata", "rules", "omitStages", "omitManagedFields"}
_RULE_FIELDS = {"level", "users", "userGroups", "verbs", "resources", "namespaces", "nonResourceURLs",
                "omitStages", "omitManagedFields"}
_GR_FIELDS = {"group", "resources", "resourceNames"}


def load_policy(path: str | Path) -> Policy:
    """Read `--audit-policy-file` (YAML or JSON); PolicyError says what is wrong, with
    kube-apiserver's words (policy/reader.go, validation.go) and the file's name."""
    if not str(path):
        raise PolicyError("file path not specified")
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PolicyError(f'failed to read file path "{path}": {e}') from None
    try:
        return parse_policy(text)
    except PolicyError as e:
        raise PolicyError(f"{e}: from file {path}") from None


def parse_policy(text: str | Mapping[str, Any]) -> Policy:
    """A Policy document (text or already decoded), validated."""
    if isinstance(text, str):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PolicyError(f"failed decoding: {e}") from None
    else:
        doc = text
    if doc is None:  # an empty file
        raise PolicyError("loaded illegal policy with 0 rules")
    if not isinstance(doc, Mapping):
        raise PolicyError(f"failed decoding: the policy is a {type(doc).__name__}, not an object")
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if api_version != API_VERSION or kind != "Policy":
        raise PolicyError(f"unknown group version field {api_version or '/'}, Kind={kind} in policy")
    _warn_unknown(doc, _POLICY_FIELDS, "")
    errs: list[str] = []
    top_omit = _stages(doc.get("omitStages"), "omitStages", errs)
    top_mf = _bool(doc.get("omitManagedFields"), "omitManagedFields", errs)
    raw_rules = doc.get("rules") or []
    if not isinstance(raw_rules, list):
        raise PolicyError("failed decoding: rules: expected a list")
    rules = [_rule(r, f"rules[{i}]", top_omit, errs) for i, r in enumerate(raw_rules)]
    if errs:
        raise PolicyError(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
    if not rules:
        raise PolicyError("loaded illegal policy with 0 rules")
    return Policy(tuple(r for r in rules if r is not None), top_omit, bool(top_mf))


def _warn_unknown(obj: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        # kube-apiserver falls back to lenient decoding with this warning: a typo'd
        # field (`verb:` for `verbs:`) is ignored, so the rule is broader than meant.
        log.warning("Audit policy contains errors, falling back to lenient decoding: "
                    "unknown field(s) %s", ", ".join(f'"{where}{k}"' for k in unknown))


def _strings(value: Any, where: str, errs: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        errs.append(f"{where}: Invalid value: {value!r}: must be a list of strings")
        return ()
    return tuple(value)


def _bool(value: Any, where: str, errs: list[str]) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    errs.append(f"{where}: Invalid value: {value!r}: must be true or false")
    return None


def _stages(value: Any, where: str, errs: list[str]) -> frozenset[str]:
    stages = _strings(value, where, errs)
    for i, s in enumerate(stages):
        if s not in STAGES:
            errs.append(f'{where}[{i}]: Invalid value: "{s}": allowed stages are {",".join(STAGES)}')
    return frozenset(s for s in stages if s in STAGES)


def _rule(raw: Any, where: str, top_omit: frozenset[str], errs: list[str]) -> PolicyRule | None:
    if not isinstance(raw, Mapping):
        errs.append(f"{where}: Invalid value: {raw!r}: must be an object")
        return None
    _warn_unknown(raw, _RULE_FIELDS, f"{where}.")
    level = raw.get("level", "")
    if not level:
        errs.append(f"{where}.level: Required value")
    elif level not in LEVELS:
        errs.append(f'{where}.level: Unsupported value: "{level}": supported values: '
                    + ", ".join(f'"{lvl}"' for lvl in LEVELS))
    urls = _strings(raw.get("nonResourceURLs"), f"{where}.nonResourceURLs", errs)
    for i, url in enumerate(urls):
        if url == "*":
            continue
        if not url.startswith("/"):
            errs.append(f'{where}.nonResourceURLs[{i}]: Invalid value: "{url}": '
                        "non-resource URL rules must begin with a '/' character")
        if url and "*" in url[:-1]:
            errs.append(f'{where}.nonResourceURLs[{i}]: Invalid value: "{url}": '
                        "non-resource URL wildcards '*' must be the final character of the rule")
    resources: list[GroupResources] = []
    raw_res = raw.get("resources") or []
    if not isinstance(raw_res, list):
        errs.append(f"{where}.resources: Invalid value: {raw_res!r}: must be a list")
        raw_res = []
    for j, gr in enumerate(raw_res):
        if not isinstance(gr, Mapping):
            errs.append(f"{where}.resources[{j}]: Invalid value: {gr!r}: must be an object")
            continue
        _warn_unknown(gr, _GR_FIELDS, f"{where}.resources[{j}].")
        group = gr.get("group") or ""
        if not isinstance(group, str):
            errs.append(f"{where}.resources.group: Invalid value: {group!r}: must be a string")
            group = ""
        elif group and (len(group) > 253 or not _DNS1123_SUBDOMAIN.match(group)):
            errs.append(f'{where}.resources.group: Invalid value: "{group}": a lowercase RFC 1123 '
                        "subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
                        "must start and end with an alphanumeric character")
        resources.append(GroupResources(
            group, _strings(gr.get("resources"), f"{where}.resources[{j}].resources", errs),
            _strings(gr.get("resourceNames"), f"{where}.resources[{j}].resourceNames", errs)))
    namespaces = _strings(raw.get("namespaces"), f"{where}.namespaces", errs)
    if urls and (resources or namespaces):
        errs.append(f"{where}.nonResourceURLs: Invalid value: {list(urls)!r}: "
                    "rules cannot apply to both regular resources and non-resource URLs")
    return PolicyRule(
        level=level if level in LEVELS else NONE,
        users=_strings(raw.get("users"), f"{where}.users", errs),
        user_groups=_strings(raw.get("userGroups"), f"{where}.userGroups", errs),
        verbs=_strings(raw.get("verbs"), f"{where}.verbs", errs),
        resources=tuple(resources), namespaces=namespaces, non_resource_urls=urls,
        omit_stages=top_omit | _stages(raw.get("omitStages"), f"{where}.omitStages", errs),
        omit_managed_fields=_bool(raw.get("omitManagedFields"), f"{where}.omitManagedFields", errs))


# ---------------------------------------------------------------------------- events


class EventSink(Protocol):
    """Where finished events go (fleet/auth/audit_log.py's AuditLog)."""

    def emit(self, event: dict[str, Any]) -> None: ...


_second_cache: tuple[int, str] = (-1, "")


def micro_time(t: float) -> str:
    """RFC 3339 with microseconds, UTC (metav1.MicroTime as kube-apiserver writes it).
    The date and time of day are formatted once a second (strftime costs ~5 µs)."""
    global _second_cache
    sec, us = divmod(round(t * 1_000_000), 1_000_000)
    cached_sec, prefix = _second_cache
    if sec != cached_sec:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        _second_cache = (sec, prefix)
    return f"{prefix}.{us:06d}Z"


def new_audit_id() -> str:
    """A random (version 4) UUID.  From `random`, not the OS: an audit ID must be
    unique, not unguessable, and uuid4() costs several times more."""
    n = (random.getrandbits(128) & ~(0xF000 << 64) & ~(0xC000 << 48)) | (0x4000 << 64) | (0x8000 << 48)
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def user_json(user: UserInfo | None) -> dict[str, Any]:
    """authentication/v1 UserInfo, empty fields omitted (`{}` for an unauthenticated request)."""
    if user is None:
        return {}
    out: dict[str, Any] = {"username": user.name}
    if user.uid:
        out["uid"] = user.uid
    if user.groups:
        out["groups"] = list(user.groups)
    if user.extra:
        out["extra"] = {k: list(v) for k, v in user.extra.items()}
    return out


def source_ips(headers: Mapping[str, str], remote: str) -> list[str]:
    """kube-apiserver's utilnet.SourceIPs: X-Forwarded-For, then X-Real-Ip, then the peer
    ("host:port" as the ASGI layer joins them; "::1:54321" for IPv6).  Header values
    are checked to be IP addresses; the peer's host comes from the socket."""
    peer = (remote.rsplit(":", 1)[0] if ":" in remote else remote).strip("[]")
    forwarded, real = headers.get("x-forwarded-for"), headers.get("x-real-ip")
    if not forwarded and not real:  # the common case, without the (slow) ipaddress module
        return [peer] if peer else []
    ips: list[str] = []

    def add(candidate: str) -> None:
        candidate = candidate.strip().strip("[]")
        try:
            ip = str(ipaddress.ip_address(candidate))
        except ValueError:
            return
        if ip not in ips:
            ips.append(ip)

    for part in (forwarded or "").split(","):
        add(part)
    add(real or "")
    if peer:
        add(peer)
    return ips


def auth_methods(headers: Mapping[str, str], peer_certs: tuple[bytes, ...] = (),
                 query: Mapping[str, str] | None = None) -> str:
    """What a refused request attempted (kube-apiserver's getAuthMethods)."""
    methods = []
    auth = headers.get("authorization", "").strip()
    scheme = auth.split(" ", 1)[0].lower() if " " in auth else ""
    if scheme == "basic":
        methods.append("basic")
    if scheme == "bearer":
        methods.append("bearer")
    if query and query.get("access_token", "").strip():
        methods.append("access_token")
    if peer_certs:
        methods.append("x509")
    if methods:
        return "Authentication failed, attempted: " + ", ".join(methods)
    return "Authentication failed, no credentials provided"


def _strip_managed_fields(obj: Any) -> Any:
    """A copy of `obj` without metadata.managedFields (in a list: of each item)."""
    if not isinstance(obj, dict):
        return obj
    out = obj
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out = dict(obj)
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    items = obj.get("items")
    if isinstance(items, list):
        if out is obj:
            out = dict(obj)
        out["items"] = [_strip_managed_fields(i) for i in items]
    return out


def _holds_secret(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    if obj.get("kind") in SECRET_KINDS:
        return True
    items = obj.get("items")
    return isinstance(items, list) and any(isinstance(i, dict) and i.get("kind") in SECRET_KINDS
                                           for i in items[:1])


def decode_body(body: bytes, content_type: str) -> Any:
    """A request/response body as JSON for the event, or None when it is not an object."""
    if not body:
        return None
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype == protobuf.MEDIA_TYPE:  # kubectl create/expose/run (client-go typed clients)
        try:
            return protobuf.decode_body(body)
        except Exception:  # the request itself answers 400 for it
            return None
    try:
        if ctype.endswith("yaml"):
            obj = yaml.safe_load(body)
        else:
            obj = json.loads(body)
    except (ValueError, yaml.YAMLError, RecursionError):  # nested past the recursion limit
        return None
    return obj if isinstance(obj, dict | list) else None


class RequestAudit:
    """One request's audit event, filled in as the request goes (kube's AuditContext).

    `authenticated` evaluates the policy (after authentication, as kube-apiserver's
    audit filter does) and emits RequestReceived; `complete` / `stream` emit the
    ResponseStarted / ResponseComplete stages; `panic` the Panic one.  Nothing is
    emitted at level None or for an omitted stage.
    """

    __slots__ = ("annotations", "attrs", "audit_id", "config", "done", "impersonated_user", "policy",
                 "received", "request_object", "request_uri", "response_started", "sink", "source_ips", "user",
                 "user_agent")

    def __init__(self, sink: EventSink, policy: Policy, *, request_uri: str, headers: Mapping[str, str],
                 remote: str = "", audit_id: str = "", received: float | None = None) -> None:
        self.sink = sink
        self.policy = policy
        self.audit_id = audit_id or headers.get(AUDIT_ID_HEADER, "").strip() or new_audit_id()
        self.received = time.time() if received is None else received
        self.request_uri = request_uri
        self.source_ips = source_ips(headers, remote)
        self.user_agent = headers.get("user-agent", "")
        self.user: UserInfo | None = None
        self.impersonated_user: UserInfo | None = None
        self.attrs: Attributes | None = None
        self.config: AuditConfig | None = None
        self.annotations: dict[str, str] = {}
        self.request_object: Any = None
        self.done = False
        self.response_started = False

    # -- what the request learns on its way

    def authenticated(self, user: UserInfo | None, attrs: Attributes) -> None:
        """Decide the level for `user` doing `attrs`; emit RequestReceived."""
        self.user, self.attrs = user, attrs
        self.config = self.policy.evaluate(user, attrs)
        if user is not None:
            self._emit(REQUEST_RECEIVED, None)

    def refused(self, attrs: Attributes, attempted: str) -> None:
        """Authentication failed (401): the policy is asked with no user.  The
        annotation says what was attempted (kube-apiserver's "Authentication failed,
        attempted: bearer") and why the authenticator refused it, if it said."""
        reason = self.annotations.get(AUTHN_FAILURE_ANNOTATION)
        self.annotations[AUTHN_FAILURE_ANNOTATION] = f"{attempted}: {reason}" if reason else attempted
        self.authenticated(None, attrs)

    def decision(self, decision: Decision) -> None:
        self.annotations[DECISION_ANNOTATION] = "allow" if decision.allowed else "forbid"
        self.annotations[REASON_ANNOTATION] = decision.reason

    @property
    def level(self) -> str:
        return self.config.level if self.config is not None else NONE

    def wants_request_body(self) -> bool:
        return _RANK[self.level] >= _RANK[REQUEST]

    def request_body(self, body: bytes, content_type: str) -> None:
        """The request's object: logged from Request level on; at Metadata only its
        name and namespace complete objectRef (a create names the object in the body)."""
        if not body or self.config is None or self.level == NONE:
            return
        wants = self.wants_request_body()
        if not wants and not (self.attrs is not None and self.attrs.resource_request and not self.attrs.name):
            return
        obj = decode_body(body, content_type)
        if obj is None:
            return
        if wants and not _holds_secret(obj):
            self.request_object = obj
        if isinstance(obj, dict) and self.attrs is not None and self.attrs.resource_request:
            meta = obj.get("metadata")
            if isinstance(meta, dict):
                name, ns = meta.get("name"), meta.get("namespace")
                if not self.attrs.name and isinstance(name, str) and name:
                    self.attrs = _replace_attrs(self.attrs, name=name)
                if not self.attrs.namespace and isinstance(ns, str) and ns:
                    self.attrs = _replace_attrs(self.attrs, namespace=ns)

    # -- stages

    def complete(self, code: int, body: bytes = b"", content_type: str = "") -> None:
        """ResponseComplete for a response sent in one piece."""
        if self.done:
            return
        self.done = True
        self._emit(RESPONSE_COMPLETE, self._status(code, body, content_type), body, content_type)

    def started(self, code: int) -> None:
        """ResponseStarted: the headers of a long-running response are out."""
        if self.response_started:
            return
        self.response_started = True
        self._emit(RESPONSE_STARTED, {"metadata": {}, "code": code})

    def upgrade_send(self, send: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        """An ASGI `send` for an upgrade (exec, attach, port-forward) that reports
        ResponseStarted when the answer goes out: 101 on accepting, or the refusal's code."""

        async def audited(msg: dict[str, Any]) -> None:
            if not self.response_started:
                kind = msg.get("type")
                if kind in ("websocket.accept", "raw.accept"):
                    self.started(101)
                elif kind in ("websocket.http.response.start", "raw.response"):
                    self.started(int(msg.get("status", 0)))
            await send(msg)

        return audited

    def panic(self, message: str) -> None:
        if self.done:
            return
        self.done = True
        self._emit(PANIC, {"metadata": {}, "status": "Failure", "message": message,
                           "reason": "InternalError", "code": 500})

    def stream(self, code: int, body: AsyncIterator[bytes]) -> AuditedStream:
        """`body`, with ResponseStarted when the first chunk is asked for (the headers
        have been sent) and ResponseComplete when it is closed, however it ends."""
        return AuditedStream(self, code, body)

    # -- the event

    def _status(self, code: int, body: bytes, content_type: str) -> dict[str, Any]:
        status: dict[str, Any] = {"metadata": {}}
        if code >= 400 and body and content_type.startswith("application/json") and len(body) < 65536:
            obj = decode_body(body, content_type)
            if isinstance(obj, dict) and obj.get("kind") == "Status":
                for k in ("status", "message", "reason", "details"):
                    if obj.get(k):
                        status[k] = obj[k]
        status["code"] = code
        return status

    def _emit(self, stage: str, status: dict[str, Any] | None, body: bytes = b"",
              content_type: str = "") -> None:
        cfg = self.config
        if cfg is None or cfg.level == NONE or stage in cfg.omit_stages:
            return
        ev: dict[str, Any] = {
            "kind": "Event", "apiVersion": API_VERSION, "level": cfg.level, "auditID": self.audit_id,
            "stage": stage, "requestURI": self.request_uri, "verb": self.attrs.verb if self.attrs else "",
            "user": user_json(self.user)}
        if self.impersonated_user is not None:
            ev["impersonatedUser"] = user_json(self.impersonated_user)
        ev["sourceIPs"] = self.source_ips
        if self.user_agent:
            ev["userAgent"] = self.user_agent
        ref = self._object_ref()
        if ref:
            ev["objectRef"] = ref
        if status is not None:
            ev["responseStatus"] = status
        if stage != REQUEST_RECEIVED and self.request_object is not None:
            obj = self.request_object
            ev["requestObject"] = _strip_managed_fields(obj) if cfg.omit_managed_fields else obj
        if stage == RESPONSE_COMPLETE and cfg.level == REQUEST_RESPONSE and body:
            obj = decode_body(body, content_type)
            if obj is not None and not _holds_secret(obj):
                ev["responseObject"] = _strip_managed_fields(obj) if cfg.omit_managed_fields else obj
        ev["requestReceivedTimestamp"] = micro_time(self.received)
        ev["stageTimestamp"] = micro_time(time.time())
        if self.annotations:
            ev["annotations"] = dict(self.annotations)
        self.sink.emit(ev)

    def _object_ref(self) -> dict[str, str] | None:
        a = self.attrs
        if a is None or not a.resource_request:
            return None
        ref = {"resource": a.resource}
        if a.namespace:
            ref["namespace"] = a.namespace
        if a.name:
            ref["name"] = a.name
        if a.group:
            ref["apiGroup"] = a.group
        ref["apiVersion"] = a.version
        if a.subresource:
            ref["subresource"] = a.subresource
        return ref


class AuditedStream:
    """A streamed response body (watch, pods/log, a proxied stream) that reports its
    stages.  A class, not an async generator: a generator never iterated skips its
    `finally` on `aclose()`, and the body it wraps (an agent connection) must be
    closed, and the request completed, whether or not a chunk was ever sent."""

    def __init__(self, audit: RequestAudit, code: int, body: AsyncIterator[bytes]) -> None:
        self.audit = audit
        self.code = code
        self.body = body
        self.it = aiter(body)
        self.started = False

    def __aiter__(self) -> AuditedStream:
        return self

    async def __anext__(self) -> bytes:
        if not self.started:
            self.started = True
            self.audit.started(self.code)
        return await anext(self.it)

    async def aclose(self) -> None:
        try:
            aclose = getattr(self.body, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self.audit.complete(self.code)


def _replace_attrs(a: Attributes, **kw: str) -> Attributes:
    from dataclasses import replace

    return replace(a, **kw)


# The request being served by the current task (None: audit off, or not in a request).
CURRENT: ContextVar[RequestAudit | None] = ContextVar("fleet_audit_request", default=None)


def record_decision(decision: Decision) -> None:
    """The authorizer's answer for the request being served (its annotations)."""
    ra = CURRENT.get()
    if ra is not None:
        ra.decision(decision)


def record_impersonation(user: UserInfo) -> None:
    """The request acts as `user` (`Impersonate-User`): the event's impersonatedUser.
    The policy was already evaluated for the authenticated user, as kube-apiserver does."""
    ra = CURRENT.get()
    if ra is not None:
        ra.impersonated_user = user


def record_annotation(key: str, value: str) -> None:
    """An annotation on the audit event of the request being served: admission plugins
    add theirs this way (kube's `AddAuditAnnotation`, e.g. PodSecurity's
    `pod-security.kubernetes.io/audit-violations`).  A key already set keeps its first
    value, as kube-apiserver does."""
    ra = CURRENT.get()
    if ra is not None:
        ra.annotations.setdefault(key, value)


def record_annotations(annotations: Mapping[str, str], *, verb: str = "") -> None:
    """Several `record_annotation`s at once (process control: the container, the
    command, the signal, the consenting ProcessControl); `verb` corrects the audited
    verb when the method alone does not say it (POST pods/signal is Fleet's `signal`)."""
    for key, value in annotations.items():
        record_annotation(key, value)
    ra = CURRENT.get()
    if verb and ra is not None and ra.attrs is not None:
        ra.attrs = _replace_attrs(ra.attrs, verb=verb)


def record_authentication_failure(reason: str) -> None:
    ra = CURRENT.get()
    if ra is not None:
        ra.annotations[AUTHN_FAILURE_ANNOTATION] = reason


@dataclass
class Auditor:
    """The policy and the sink: what the API server holds when audit is on."""

    policy: Policy
    sink: Any  # fleet.auth.audit_log.AuditLog (an EventSink with run/close)
    clock: Callable[[], float] = field(default=time.time)

    def begin(self, *, request_uri: str, headers: Mapping[str, str], remote: str = "") -> RequestAudit:
        return RequestAudit(self.sink, self.policy, request_uri=request_uri, headers=headers,
                            remote=remote, received=self.clock())


def auditor_from_flags(log_path: str, policy_file: str = "", *, max_size_mb: int = 0,
                       max_age_days: int = 0, max_backups: int = 0) -> Auditor | None:
    """The Auditor of `--audit-log-path` / `--audit-policy-file` (None: audit off).

    A bad policy or an unwritable log raises PolicyError / OSError: the server
    refuses to start, as kube-apiserver does.  A policy without a log path is
    validated and then unused (no backend), as in kube-apiserver.
    """
    from fleet.auth.audit_log import AuditLog

    policy = load_policy(policy_file) if policy_file else DEFAULT_POLICY
    if not log_path:
        if policy_file:
            log.warning("--audit-policy-file without --audit-log-path: audit is off")
        return None
    if max_size_mb < 0 or max_age_days < 0 or max_backups < 0:
        raise PolicyError("--audit-log-maxsize, --audit-log-maxage and --audit-log-maxbackup "
                          "must not be negative")
    sink = AuditLog(log_path, max_size_mb=max_size_mb, max_age_days=max_age_days, max_backups=max_backups)
    sink.open()
    return Auditor(policy, sink)


def check_log_path(path: str) -> None:
    """Raise OSError if `path` cannot be an audit log (its directory is created, as
    kube-apiserver does, with mode 0700)."""
    if path in ("", "-"):
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.close(fd)
