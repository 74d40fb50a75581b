"""PodSecurity admission: the Pod Security Standards, per namespace (k8s.io/pod-security-admission).

A namespace chooses, by label, the level (privileged / baseline / restricted)
and version each of three modes applies:

    pod-security.kubernetes.io/enforce: restricted      (+ enforce-version: v1.30)
    pod-security.kubernetes.io/audit:   baseline        (+ audit-version)
    pod-security.kubernetes.io/warn:    restricted      (+ warn-version)

* enforce — a pod that violates it is refused: 403 `pods "x" is forbidden:
  violates PodSecurity "restricted:latest": <every violation>`.
* warn — the request succeeds with a `Warning: would violate PodSecurity ...`
  header (kubectl prints it).
* audit — the request's audit event carries the annotation
  `pod-security.kubernetes.io/audit-violations`.

Pods are judged on create and on updates that change what the checks read (an
image, a container added, the seccomp / AppArmor annotations or any security
field); kinds with a pod template (Deployments, ReplicaSets, StatefulSets,
DaemonSets, Jobs, CronJobs, ReplicationControllers, PodTemplates) get warn and
audit only, as Kubernetes does, so a workload is never refused for what its
pods will be refused for.  Namespaces: invalid label values are refused (422,
Kubernetes' message); a changed enforce level warns which existing pods
would violate it.  Namespaces without labels take the server's defaults
(`--pod-security-config`, Kubernetes' PodSecurityConfiguration, which also
lists exempt usernames, runtime classes and namespaces).

The checks themselves are pure functions in podsecurity_checks.py; `decide`
and `policy_from_labels` here are pure too; the plugin only reads the
namespace (watch-fed cache, store fallback) and reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleet.admission import add_warning
from fleet.admission.podsecurity_checks import (
    PRIVILEGED,
    RESTRICTED,
    LevelVersion,
    PolicyError,
    compare_levels,
    evaluate,
    forbidden_reason,
    parse_level,
    parse_version,
)
from fleet.api import errors, meta
from fleet.auth import Attributes, UserInfo
from fleet.auth.audit import record_annotation
from fleet.store import KeyNotFound

LABEL_PREFIX = "pod-security.kubernetes.io/"
MODES = ("enforce", "audit", "warn")
# Audit annotations (kube's plugin prefixes its keys with its name's domain).
ANNOTATION_ENFORCE_POLICY = LABEL_PREFIX + "enforce-policy"
ANNOTATION_AUDIT_VIOLATIONS = LABEL_PREFIX + "audit-violations"
ANNOTATION_EXEMPT = LABEL_PREFIX + "exempt"
ANNOTATION_ERROR = LABEL_PREFIX + "error"

CONFIG_API_VERSIONS = ("pod-security.admission.config.k8s.io/v1", "pod-security.admission.config.k8s.io/v1beta1")

# (group, resource) → path from the object to its pod template.
TEMPLATE_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "replicationcontrollers"): ("spec", "template"),
    ("", "podtemplates"): ("template",),
    ("apps", "deployments"): ("spec", "template"),
    ("apps", "replicasets"): ("spec", "template"),
    ("apps", "statefulsets"): ("spec", "template"),
    ("apps", "daemonsets"): ("spec", "template"),
    ("batch", "jobs"): ("spec", "template"),
    ("batch", "cronjobs"): ("spec", "jobTemplate", "spec", "template"),
}
# Pod subresources never judged (Kubernetes' ignoredPodSubresources, plus Fleet's signal);
# any other (the pod itself, ephemeralcontainers, resize) carries a pod and is judged,
# so a subresource added later fails safe.
IGNORED_POD_SUBRESOURCES = frozenset({"exec", "attach", "binding", "eviction", "log", "portforward", "proxy",
                                      "status", "signal"})


@dataclass(frozen=True)
class Policy:
    enforce: LevelVersion = LevelVersion(PRIVILEGED)
    audit: LevelVersion = LevelVersion(PRIVILEGED)
    warn: LevelVersion = LevelVersion(PRIVILEGED)

    def fully_privileged(self) -> bool:
        return all(lv.level == PRIVILEGED for lv in (self.enforce, self.audit, self.warn))


@dataclass(frozen=True)
class Exemptions:
    usernames: frozenset[str] = frozenset()
    runtime_classes: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Config:
    """The server's PodSecurityConfiguration: defaults for unlabelled modes, exemptions."""

    defaults: Policy = field(default_factory=Policy)
    exemptions: Exemptions = field(default_factory=Exemptions)


class ConfigError(ValueError):
    """The configuration file cannot be used: the server must not start with it."""


# ------------------------------------------------------------------ configuration

def parse_config(doc: Any) -> Config:
    """A PodSecurityConfiguration (or an AdmissionConfiguration holding one for the
    `PodSecurity` plugin) → Config.  Unknown levels or versions raise ConfigError."""
    if not isinstance(doc, dict):
        raise ConfigError("the pod security configuration must be an object")
    if doc.get("kind") == "AdmissionConfiguration":
        for plugin in doc.get("plugins") or []:
            if isinstance(plugin, dict) and plugin.get("name") == "PodSecurity":
                if "path" in plugin and "configuration" not in plugin:
                    return load_config(plugin["path"])
                return parse_config(plugin.get("configuration"))
        return Config()
    if doc.get("kind") != "PodSecurityConfiguration" or doc.get("apiVersion") not in CONFIG_API_VERSIONS:
        raise ConfigError(f"expected kind PodSecurityConfiguration, apiVersion one of {', '.join(CONFIG_API_VERSIONS)}; "
                          f"got {doc.get('kind')!r} {doc.get('apiVersion')!r}")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError("defaults must be an object")
    errs: list[str] = []
    modes: dict[str, LevelVersion] = {}
    for mode in MODES:
        try:
            level = parse_level(str(defaults.get(mode, PRIVILEGED)))
        except PolicyError as e:
            errs.append(f"defaults.{mode}: Invalid value: {defaults.get(mode)!r}: {e}")
            level = PRIVILEGED
        try:
            minor = parse_version(str(defaults.get(f"{mode}-version", "latest")))
        except PolicyError as e:
            errs.append(f"defaults.{mode}-version: Invalid value: {defaults.get(f'{mode}-version')!r}: {e}")
            minor = None
        modes[mode] = LevelVersion(level, minor)
    ex = doc.get("exemptions") or {}
    if not isinstance(ex, dict):
        raise ConfigError("exemptions must be an object")

    def names(key: str) -> frozenset[str]:
        v = ex.get(key) or []
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            errs.append(f"exemptions.{key}: must be a list of non-empty strings")
            return frozenset()
        return frozenset(v)

    exemptions = Exemptions(names("usernames"), names("runtimeClasses"), names("namespaces"))
    if errs:
        raise ConfigError("; ".join(errs))
    return Config(Policy(modes["enforce"], modes["audit"], modes["warn"]), exemptions)


def load_config(path: str | Path) -> Config:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read the pod security configuration {path}: {e}") from None
    return parse_config(doc)


# ------------------------------------------------------------------ pure decisions

def policy_from_labels(labels: dict[str, Any] | None, defaults: Policy) -> tuple[Policy, list[dict[str, str]]]:
    """Kubernetes' PolicyToEvaluate: the namespace's policy and the causes of its bad labels.

    Each label overrides its part of the defaults (a level label alone keeps the default
    version).  A value that does not parse still yields a policy, as Kubernetes': a bad
    enforce level is `restricted` (fail closed), a bad audit or warn level `privileged`
    (fail open), a bad version `latest`.
    """
    labels = labels or {}
    causes: list[dict[str, str]] = []
    modes = {"enforce": defaults.enforce, "audit": defaults.audit, "warn": defaults.warn}
    for mode in MODES:
        level, minor = modes[mode].level, modes[mode].minor
        key = LABEL_PREFIX + mode
        if key in labels:
            try:
                level = parse_level(str(labels[key]))
            except PolicyError as e:
                causes.append(_label_cause(key, labels[key], e))
                level = RESTRICTED if mode == "enforce" else PRIVILEGED
        vkey = key + "-version"
        if vkey in labels:
            try:
                minor = parse_version(str(labels[vkey]))
            except PolicyError as e:
                causes.append(_label_cause(vkey, labels[vkey], e))
                minor = None
        modes[mode] = LevelVersion(level, minor)
    return Policy(modes["enforce"], modes["audit"], modes["warn"]), causes


def _label_cause(key: str, value: Any, err: Exception) -> dict[str, str]:
    return errors.cause(f"metadata.labels[{key}]", f'Invalid value: "{value}": {err}')


@dataclass
class Decision:
    """What admission does with one pod (or template): refuse, warn, annotate."""

    denied: str = ""  # the `violates PodSecurity ...` text; "" = allowed
    warnings: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


def decide(policy: Policy, pod_meta: dict[str, Any], pod_spec: dict[str, Any], *, enforce: bool,
           exempt_runtime_classes: frozenset[str] = frozenset(), policy_error: str = "") -> Decision:
    """Kubernetes' EvaluatePod: enforce (pods only), then audit, then warn — no warning
    on a request that is refused anyway."""
    if isinstance(pod_spec, dict) and pod_spec.get("runtimeClassName") in exempt_runtime_classes:
        return Decision(annotations={ANNOTATION_EXEMPT: "runtimeClass"})
    d = Decision()
    if policy_error:
        d.annotations[ANNOTATION_ERROR] = f"Failed to parse policy: {policy_error}"
    if enforce:
        d.annotations[ANNOTATION_ENFORCE_POLICY] = str(policy.enforce)
        v = evaluate(policy.enforce, pod_meta, pod_spec)
        if v:
            d.denied = f'violates PodSecurity "{policy.enforce}": {forbidden_reason(v)}'
    v = evaluate(policy.audit, pod_meta, pod_spec)
    if v:
        d.annotations[ANNOTATION_AUDIT_VIOLATIONS] = f'would violate PodSecurity "{policy.audit}": {forbidden_reason(v)}'
    if not d.denied:
        v = evaluate(policy.warn, pod_meta, pod_spec)
        if v:
            d.warnings.append(f'would violate PodSecurity "{policy.warn}": {forbidden_reason(v)}')
    return d


def _security_view(obj: dict[str, Any]) -> Any:
    """What the checks (and Kubernetes' isSignificantPodUpdate) read of a pod."""
    md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    ann = md.get("annotations") if isinstance(md.get("annotations"), dict) else {}
    sec_ann = {k: v for k, v in ann.items() if "seccomp" in k or "apparmor" in k}
    keep = ("securityContext", "hostNetwork", "hostPID", "hostIPC", "volumes", "os", "runtimeClassName")
    view: dict[str, Any] = {k: spec.get(k) for k in keep}
    for k in ("initContainers", "containers", "ephemeralContainers"):
        cs = spec.get(k) if isinstance(spec.get(k), list) else []
        view[k] = [{f: c.get(f) for f in ("name", "image", "securityContext", "ports")} if isinstance(c, dict)
                   else c for c in cs]
    return sec_ann, view


def significant_pod_update(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    return old is None or _security_view(new) != _security_view(old)


# Kubernetes checks at most this many existing pods when a namespace's enforce level changes.
MAX_PODS_TO_CHECK = 3000


def prioritize_pods(pods: list[dict[str, Any]], exempt_runtime_classes: frozenset[str] = frozenset()
                    ) -> list[dict[str, Any]]:
    """Kubernetes' prioritizePods: exempt runtime classes dropped; pods without a controller
    and the first pod of each controller first, the other replicas after them."""
    first: list[dict[str, Any]] = []
    replicas: list[dict[str, Any]] = []
    seen: set[str] = set()
    for p in pods:
        if (p.get("spec") or {}).get("runtimeClassName") in exempt_runtime_classes:
            continue
        ctrl = next((r for r in (p.get("metadata") or {}).get("ownerReferences") or []
                     if isinstance(r, dict) and r.get("controller")), None)
        if ctrl is None:
            first.append(p)
        elif ctrl.get("uid") in seen:
            replicas.append(p)
        else:
            seen.add(str(ctrl.get("uid")))
            first.append(p)
    return first + replicas


def existing_pod_warnings(namespace: str, enforce: LevelVersion, pods: list[dict[str, Any]],
                          exempt_runtime_classes: frozenset[str] = frozenset(),
                          max_pods: int = MAX_PODS_TO_CHECK) -> list[str]:
    """Kubernetes' EvaluatePodsInNamespace: pods that would violate a new enforce level,
    grouped by identical reasons (the alphabetically first pod named), sorted."""
    pods = prioritize_pods(pods, exempt_runtime_classes)
    total = len(pods)
    pods = pods[:max_pods]
    counts: dict[str, list[Any]] = {}
    for p in pods:
        v = evaluate(enforce, p.get("metadata") or {}, p.get("spec") or {})
        if not v:
            continue
        # The reasons alone here (AggregateCheckResult.ForbiddenReason), no details.
        reason = ", ".join(x.reason for x in v)
        name = str((p.get("metadata") or {}).get("name", ""))
        if reason not in counts:
            counts[reason] = [name, 0]
        elif name < counts[reason][0]:
            counts[reason][0] = name
        counts[reason][1] += 1
    out = []
    if len(pods) < total:
        out.append(f"new PodSecurity enforce level only checked against the first {len(pods)} of {total} "
                   "existing pods")
    if counts:
        out.append(f'existing pods in namespace "{namespace}" violate the new PodSecurity enforce level "{enforce}"')
    decorated = []
    for reason, (name, n) in counts.items():
        if n == 1:
            decorated.append(f"{name}: {reason}")
        elif n == 2:
            decorated.append(f"{name} (and 1 other pod): {reason}")
        else:
            decorated.append(f"{name} (and {n - 1} other pods): {reason}")
    return out + sorted(decorated)


def _equivalent(a: Policy, b: Policy) -> bool:
    """Same levels, and same versions where the level is not privileged (Policy.Equivalent)."""
    return all(x.level == y.level and (x.level == PRIVILEGED or x.minor == y.minor)
               for x, y in ((a.enforce, b.enforce), (a.audit, b.audit), (a.warn, b.warn)))


def exempt_namespace_warning(namespace: str, policy: Policy, labels: dict[str, Any] | None,
                             defaults: Policy) -> str:
    """Kubernetes' warning when an exempt namespace is given a non-privileged policy by label."""
    labels = labels or {}
    if policy.fully_privileged() or _equivalent(policy, defaults):
        return ""
    parts = []
    for mode, lv in (("enforce", policy.enforce), ("audit", policy.audit), ("warn", policy.warn)):
        if lv.level != PRIVILEGED and (LABEL_PREFIX + mode in labels or LABEL_PREFIX + mode + "-version" in labels):
            parts.append(f"{mode}={lv}")
    return f'namespace "{namespace}" is exempt from Pod Security, and the policy ({", ".join(parts)}) will be ignored'


def _template(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    cur: Any = obj
    for k in path:
        cur = cur.get(k) if isinstance(cur, dict) else None
    return cur if isinstance(cur, dict) else None


# ------------------------------------------------------------------ the plugin

class PodSecurity:
    """The validating plugin.  `namespaces` is a running watch-fed namespace cache
    (`get(name)`; fleet/server/nscache.py); without one, or before it has the
    namespace, the store is read."""

    name = "PodSecurity"

    def __init__(self, store: Any, config: Config | None = None, namespaces: Any = None) -> None:
        self.store = store
        self.config = config or Config()
        self.namespaces = namespaces

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        if obj is None or attrs.verb not in ("create", "update", "patch"):
            return
        if attrs.group == "" and attrs.resource == "namespaces":
            await self._validate_namespace(attrs, obj, old)
            return
        if attrs.group == "" and attrs.resource == "pods":
            if attrs.subresource in IGNORED_POD_SUBRESOURCES or obj.get("kind", "Pod") != "Pod":
                return
            is_pod = True
        elif (attrs.group, attrs.resource) in TEMPLATE_PATHS:
            if attrs.subresource:
                return
            is_pod = False
        else:
            return
        ex = self.config.exemptions
        if attrs.namespace in ex.namespaces:
            record_annotation(ANNOTATION_EXEMPT, "namespace")
            return
        if user.name in ex.usernames:
            record_annotation(ANNOTATION_EXEMPT, "user")
            return
        ns = await self._namespace(attrs.namespace)
        labels = ((ns or {}).get("metadata") or {}).get("labels")
        policy, causes = policy_from_labels(labels, self.config.defaults)
        if not causes and is_pod and policy.fully_privileged():
            # Kubernetes' sharedAllowedPrivilegedResponse: the audit event still says so.
            record_annotation(ANNOTATION_ENFORCE_POLICY, str(LevelVersion(PRIVILEGED)))
            return
        if not causes and not is_pod and policy.warn.level == PRIVILEGED and policy.audit.level == PRIVILEGED:
            return
        if is_pod:
            if attrs.verb != "create" and not significant_pod_update(obj, old):
                return
            pod_meta, pod_spec = obj.get("metadata") or {}, obj.get("spec") or {}
        else:
            tmpl = _template(obj, TEMPLATE_PATHS[(attrs.group, attrs.resource)])
            if tmpl is None:
                return
            pod_meta, pod_spec = tmpl.get("metadata") or {}, tmpl.get("spec") or {}
        err = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
        d = decide(policy, pod_meta if isinstance(pod_meta, dict) else {},
                   pod_spec if isinstance(pod_spec, dict) else {}, enforce=is_pod,
                   exempt_runtime_classes=ex.runtime_classes, policy_error=err)
        for k, v in d.annotations.items():
            record_annotation(k, v)
        for w in d.warnings:
            add_warning(w)
        if d.denied:
            raise errors.Forbidden(f'{attrs.resource} "{attrs.name}" is forbidden: {d.denied}',
                                   name=attrs.name, group=attrs.group, kind=attrs.resource)

    async def _validate_namespace(self, attrs: Attributes, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if attrs.subresource:
            return
        labels = (obj.get("metadata") or {}).get("labels")
        policy, causes = policy_from_labels(labels, self.config.defaults)
        exempt = attrs.name in self.config.exemptions.namespaces
        if attrs.verb == "create" or old is None:
            if causes:
                raise errors.Invalid.for_object("Namespace", "", attrs.name, causes)
            if exempt and (w := exempt_namespace_warning(attrs.name, policy, labels, self.config.defaults)):
                add_warning(w)
            return
        old_policy, old_causes = policy_from_labels((old.get("metadata") or {}).get("labels"),
                                                    self.config.defaults)
        # Bad labels are refused on update only when they changed (a namespace that
        # already had them can still be edited otherwise), as Kubernetes does.
        if causes and causes != old_causes:
            raise errors.Invalid.for_object("Namespace", "", attrs.name, causes)
        new_e, old_e = policy.enforce, old_policy.enforce
        if new_e == old_e or new_e.level == PRIVILEGED:
            return
        if new_e.minor == old_e.minor and compare_levels(new_e.level, old_e.level) < 1:
            return
        if exempt:
            if w := exempt_namespace_warning(attrs.name, policy, labels, self.config.defaults):
                add_warning(w)
            return
        pods = (await self.store.list(meta.store_key("", "pods", attrs.name))).items
        for w in existing_pod_warnings(attrs.name, new_e, pods, self.config.exemptions.runtime_classes):
            add_warning(w)

    async def _namespace(self, name: str) -> dict[str, Any] | None:
        if self.namespaces is not None:
            ns = self.namespaces.get(name)
            if ns is not None:
                return ns
        try:
            return await self.store.get(meta.store_key("", "namespaces", None, name))
        except KeyNotFound:
            return None
