"""Resource quota arithmetic: quantities with Kubernetes' canonical printing, resource
lists, and the evaluators that say what an object costs (no I/O).

Both halves of ResourceQuota use this module: the admission plugin
(fleet/admission/resourcequota.py) charges a new object to the quotas of its
namespace, and the quota controller (fleet/controllers/resourcequota.py)
recomputes `status.used` from the objects themselves.  They must agree to the
last milli-CPU, so the rules live here once.

**Quantities keep their format.**  kube-apiserver prints a quantity in the
format it was written in (`DecimalSI` for `500m` or `2`, `BinarySI` for `1Gi`,
`DecimalExponent` for `1e3`), canonicalised: `1500m` prints as `1500m`, `2000`
as `2k`, `1536Mi` stays `1536Mi`, `0.5` becomes `500m`.  A sum keeps the
format of its first non-zero term.  Quota errors quote these strings
("requested: requests.memory=512Mi, used: requests.memory=1536Mi"), so Fleet
prints them the same way (`Quantity.__str__`, from apimachinery's
`CanonicalizeBytes`).

**Evaluators** (k8s.io/kubernetes/pkg/quota/v1/evaluator/core and apiserver's
generic object counter) know, per resource, which quota resource names they
serve (`matching_resources`), whether a quota's scopes select an object
(`matches_scopes`), what one object uses (`usage`) and which explicit
requests a quota demands of it (`constraints`: the "must specify cpu" rule).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Protocol

from fleet.api import meta
from fleet.api.quantity import _BINARY, _EXPONENT, QuantityError, parse_quantity

DECIMAL_SI, BINARY_SI, DECIMAL_EXPONENT = "DecimalSI", "BinarySI", "DecimalExponent"

_DECIMAL_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIX = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_NANO = Decimal(10) ** 9


@dataclass(frozen=True)
class Quantity:
    """An exact quantity and the format it prints in (resource.Quantity)."""

    value: Decimal
    format: str = DECIMAL_SI

    @classmethod
    def parse(cls, raw: Any) -> Quantity:
        """A quantity from its JSON form; raises QuantityError when it is not one."""
        value = parse_quantity(raw)
        return cls(value, format_of(raw))

    @classmethod
    def of(cls, n: int | Decimal, fmt: str = DECIMAL_SI) -> Quantity:
        return cls(Decimal(n), fmt)

    def __add__(self, other: Quantity) -> Quantity:
        # Quantity.Add: a zero receiver takes the other's format.
        fmt = other.format if self.value == 0 else self.format
        return Quantity(self.value + other.value, fmt)

    def __sub__(self, other: Quantity) -> Quantity:
        fmt = other.format if self.value == 0 else self.format
        return Quantity(self.value - other.value, fmt)

    def __str__(self) -> str:
        return canonical(self.value, self.format)

    def milli(self) -> int:
        return math.ceil(self.value * 1000)


def format_of(raw: Any) -> str:
    """The format a quantity was written in: its suffix decides (numbers are DecimalSI)."""
    if not isinstance(raw, str):
        return DECIMAL_SI
    suffix = raw.lstrip("+-0123456789.")
    if suffix in _BINARY:
        return BINARY_SI
    if _EXPONENT.fullmatch(suffix):
        return DECIMAL_EXPONENT
    return DECIMAL_SI


def canonical(value: Decimal, fmt: str = DECIMAL_SI) -> str:
    """apimachinery's Quantity.String(): the shortest exact form in `fmt`.

    BinarySI falls back to DecimalSI below 1024 and for fractions (to lose no
    precision), as Kubernetes does; values are rounded up to the nano.
    """
    if value == 0:
        return "0"
    nanos = int((value * _NANO).to_integral_value(rounding=ROUND_CEILING))
    if nanos == 0:
        return "0"
    if fmt == BINARY_SI and (-1024 < value < 1024 or nanos % 10**9):
        fmt = DECIMAL_SI
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if fmt == BINARY_SI:
        n, exp = nanos // 10**9, 0
        while n % 1024 == 0 and exp < len(_BINARY_SUFFIX) - 1:
            n //= 1024
            exp += 1
        return f"{sign}{n}{_BINARY_SUFFIX[exp]}"
    mantissa, exp = nanos, -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exp += 1
    # The exponent is a multiple of 3 (k, M, G... or e3, e6...).
    r = exp % 3
    if r:
        mantissa *= 10**r
        exp -= r
    if fmt == DECIMAL_SI and exp in _DECIMAL_SUFFIX:
        return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exp]}"
    return f"{sign}{mantissa}e{exp}" if exp else f"{sign}{mantissa}"


# ---------------------------------------------------------------------------------------
# Resource lists (map resource name -> Quantity)

ResourceList = dict[str, Quantity]


def parse_list(raw: Any) -> ResourceList:
    """A ResourceList from JSON; entries that are not quantities are skipped (validation
    reports them elsewhere)."""
    out: ResourceList = {}
    if not isinstance(raw, Mapping):
        return out
    for name, value in raw.items():
        try:
            out[str(name)] = Quantity.parse(value)
        except QuantityError:
            continue
    return out


def to_json(rl: Mapping[str, Quantity]) -> dict[str, str]:
    return {k: str(v) for k, v in sorted(rl.items())}


def add(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> ResourceList:
    """quota.Add: every key of either, summed where both have it."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out else v
    return out


def subtract_non_negative(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> ResourceList:
    """quota.SubtractWithNonNegativeResult: a - b per key, never below zero (keys of both)."""
    zero = Quantity(Decimal(0))
    out: ResourceList = {}
    for k, v in a.items():
        q = v - b[k] if k in b else v
        out[k] = q if q.value > 0 else zero
    for k in b:
        out.setdefault(k, zero)
    return out


def mask(rl: Mapping[str, Quantity], names: Iterable[str]) -> ResourceList:
    keep = set(names)
    return {k: v for k, v in rl.items() if k in keep}


def remove_zeros(rl: Mapping[str, Quantity]) -> ResourceList:
    return {k: v for k, v in rl.items() if v.value != 0}


def negative(rl: Mapping[str, Quantity]) -> list[str]:
    return sorted(k for k, v in rl.items() if v.value < 0)


def equals(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> bool:
    """Same keys, equal values (formats do not matter)."""
    return a.keys() == b.keys() and all(a[k].value == b[k].value for k in a)


def less_than_or_equal(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> tuple[bool, list[str]]:
    """quota.LessThanOrEqual: every key of `b` that `a` has is not above `b`'s value;
    also returns the keys that are."""
    exceeded = sorted(k for k, limit in b.items() if k in a and a[k].value > limit.value)
    return not exceeded, exceeded


def pretty(rl: Mapping[str, Quantity]) -> str:
    """prettyPrint of the quota admission errors: `a=1,b=2Gi`, sorted by name."""
    return ",".join(f"{k}={rl[k]}" for k in sorted(rl))


# ---------------------------------------------------------------------------------------
# Resource names

PODS, SERVICES, CONFIGMAPS, SECRETS = "pods", "services", "configmaps", "secrets"
PVCS, RCS, QUOTAS = "persistentvolumeclaims", "replicationcontrollers", "resourcequotas"
SERVICES_NODEPORTS, SERVICES_LOADBALANCERS = "services.nodeports", "services.loadbalancers"
CPU, MEMORY, EPHEMERAL_STORAGE, STORAGE = "cpu", "memory", "ephemeral-storage", "storage"
REQUESTS_PREFIX, LIMITS_PREFIX = "requests.", "limits."
HUGEPAGES_PREFIX = "hugepages-"
STORAGE_CLASS_SUFFIX = ".storageclass.storage.k8s.io/"

# The names kube-apiserver accepts in spec.hard without a domain (IsStandardQuotaResourceName).
STANDARD_QUOTA_RESOURCES = frozenset({
    PODS, SERVICES, RCS, QUOTAS, SECRETS, CONFIGMAPS, PVCS, SERVICES_NODEPORTS, SERVICES_LOADBALANCERS,
    CPU, MEMORY, EPHEMERAL_STORAGE, "requests.cpu", "requests.memory", "requests.storage",
    "requests.ephemeral-storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage",
})
# Counted in whole objects: quota values for them must be integers (IsIntegerResourceName).
INTEGER_RESOURCES = frozenset({PODS, SERVICES, RCS, QUOTAS, SECRETS, CONFIGMAPS, PVCS,
                               SERVICES_NODEPORTS, SERVICES_LOADBALANCERS})

# The object-count names that predate `count/<resource>` (legacyObjectCountAliases).
LEGACY_COUNT_ALIASES = {CONFIGMAPS: CONFIGMAPS, QUOTAS: QUOTAS, RCS: RCS, SECRETS: SECRETS}


def object_count_name(group: str, resource: str) -> str:
    """`count/pods`, `count/deployments.apps` (ObjectCountQuotaResourceNameFor)."""
    return f"count/{resource}.{group}" if group else f"count/{resource}"


def parse_object_count_name(name: str) -> tuple[str, str] | None:
    """(group, resource) of a `count/...` name, None for anything else."""
    if not name.startswith("count/") or len(name) <= len("count/"):
        return None
    resource, _, group = name[len("count/"):].partition(".")
    return group, resource


def is_standard_quota_resource(name: str) -> bool:
    return (name in STANDARD_QUOTA_RESOURCES or name.startswith(HUGEPAGES_PREFIX)
            or name.startswith(REQUESTS_PREFIX + HUGEPAGES_PREFIX) or name.startswith("count/"))


def is_integer_resource(name: str) -> bool:
    return name in INTEGER_RESOURCES or name.startswith("count/") or is_extended_quota_name(name)


def is_native(name: str) -> bool:
    """IsNativeResource: no domain, or a kubernetes.io one."""
    return "/" not in name or "kubernetes.io/" in name


_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource(name: str) -> bool:
    """IsExtendedResourceName: a device-plugin style `vendor.com/thing`."""
    if is_native(name) or name.startswith(REQUESTS_PREFIX):
        return False
    _, _, base = name.rpartition("/")
    return bool(_QUALIFIED.fullmatch(base))


def is_extended_quota_name(name: str) -> bool:
    """`requests.vendor.com/gpu`: the only quota form extended resources have."""
    return not is_native(name) and name.startswith(REQUESTS_PREFIX)


# ---------------------------------------------------------------------------------------
# Scopes

TERMINATING, NOT_TERMINATING = "Terminating", "NotTerminating"
BEST_EFFORT, NOT_BEST_EFFORT = "BestEffort", "NotBestEffort"
PRIORITY_CLASS, CROSS_NAMESPACE_POD_AFFINITY = "PriorityClass", "CrossNamespacePodAffinity"
SCOPES = (TERMINATING, NOT_TERMINATING, BEST_EFFORT, NOT_BEST_EFFORT, PRIORITY_CLASS,
          CROSS_NAMESPACE_POD_AFFINITY)
SCOPE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# What each scope may limit (IsResourceQuotaScopeValidForResource).
POD_COMPUTE_RESOURCES = frozenset({CPU, MEMORY, "limits.cpu", "limits.memory", "requests.cpu",
                                   "requests.memory"})
SCOPE_RESOURCES = {
    TERMINATING: POD_COMPUTE_RESOURCES | {PODS},
    NOT_TERMINATING: POD_COMPUTE_RESOURCES | {PODS},
    BEST_EFFORT: frozenset({PODS}),
    NOT_BEST_EFFORT: POD_COMPUTE_RESOURCES | {PODS},
    PRIORITY_CLASS: POD_COMPUTE_RESOURCES | {PODS},
    CROSS_NAMESPACE_POD_AFFINITY: POD_COMPUTE_RESOURCES | {PODS},
}


@dataclass(frozen=True)
class ScopeRequirement:
    scope: str
    operator: str = "Exists"
    values: tuple[str, ...] = ()


def scope_requirements(quota: Mapping[str, Any]) -> list[ScopeRequirement]:
    """spec.scopes (each an Exists) and spec.scopeSelector.matchExpressions, together."""
    spec = quota.get("spec") if isinstance(quota.get("spec"), Mapping) else {}
    out = [ScopeRequirement(str(s)) for s in spec.get("scopes") or [] if isinstance(s, str)]
    sel = spec.get("scopeSelector")
    if isinstance(sel, Mapping):
        for e in sel.get("matchExpressions") or []:
            if isinstance(e, Mapping):
                out.append(ScopeRequirement(str(e.get("scopeName", "")), str(e.get("operator", "")),
                                            tuple(str(v) for v in e.get("values") or [])))
    return out


# ---------------------------------------------------------------------------------------
# Evaluators


class Evaluator(Protocol):
    group: str
    resource: str

    def handles(self, verb: str, subresource: str) -> bool: ...

    def matching_resources(self, names: Iterable[str]) -> list[str]: ...

    def matches_scope(self, req: ScopeRequirement, obj: Mapping[str, Any]) -> bool: ...

    def usage(self, obj: Mapping[str, Any], now: float) -> ResourceList: ...

    def constraints(self, required: Iterable[str], obj: Mapping[str, Any]) -> str | None: ...


def matches(evaluator: Evaluator, quota: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    """generic.Matches: the quota limits something this evaluator counts, and every one
    of its scopes selects the object."""
    hard = (quota.get("status") or {}).get("hard") or {}
    if not evaluator.matching_resources(hard):
        return False
    return all(evaluator.matches_scope(r, obj) for r in scope_requirements(quota))


def one() -> Quantity:
    return Quantity(Decimal(1))


class ObjectCountEvaluator:
    """Counts objects of one resource (`count/<resource>.<group>` and a legacy alias)."""

    def __init__(self, group: str, resource: str, alias: str | None = None) -> None:
        self.group = group
        self.resource = resource
        self.names = tuple(n for n in (object_count_name(group, resource), alias) if n)

    def handles(self, verb: str, subresource: str) -> bool:
        return verb == "create" and not subresource

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n in self.names]

    def matches_scope(self, req: ScopeRequirement, obj: Mapping[str, Any]) -> bool:
        return False  # scopes are about pods

    def usage(self, obj: Mapping[str, Any], now: float) -> ResourceList:
        return {n: one() for n in self.names}

    def constraints(self, required: Iterable[str], obj: Mapping[str, Any]) -> str | None:
        return None


class ServiceEvaluator(ObjectCountEvaluator):
    """Services: the count, load balancers, and node ports (a type can change, so
    updates are charged too)."""

    def __init__(self) -> None:
        super().__init__("", SERVICES, SERVICES)
        self.names = (*self.names, SERVICES_LOADBALANCERS, SERVICES_NODEPORTS)

    def handles(self, verb: str, subresource: str) -> bool:
        return verb in ("create", "update", "patch") and not subresource

    def usage(self, obj: Mapping[str, Any], now: float) -> ResourceList:
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        ports = [p for p in spec.get("ports") or [] if isinstance(p, Mapping)]
        kind = spec.get("type")
        nodeports = 0
        if kind == "NodePort":
            nodeports = len(ports)
        elif kind == "LoadBalancer":
            if spec.get("allocateLoadBalancerNodePorts") is False:
                nodeports = sum(1 for p in ports if p.get("nodePort"))
            else:
                nodeports = len(ports)
        return {object_count_name("", SERVICES): one(), SERVICES: one(),
                SERVICES_LOADBALANCERS: Quantity.of(1 if kind == "LoadBalancer" else 0),
                SERVICES_NODEPORTS: Quantity.of(nodeports)}


class PersistentVolumeClaimEvaluator(ObjectCountEvaluator):
    """Claims: the count and the storage they request, in total and per storage class."""

    def __init__(self) -> None:
        super().__init__("", PVCS, PVCS)

    def handles(self, verb: str, subresource: str) -> bool:
        return verb in ("create", "update", "patch") and subresource in ("", "status")

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        out = []
        for n in names:
            if n in self.names or n == "requests.storage":
                out.append(n)
            elif STORAGE_CLASS_SUFFIX in n and n.rsplit("/", 1)[1] in (PVCS, "requests.storage"):
                out.append(n)
        return out

    def usage(self, obj: Mapping[str, Any], now: float) -> ResourceList:
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        out: ResourceList = {object_count_name("", PVCS): one(), PVCS: one()}
        cls = spec.get("storageClassName")
        if not cls:
            cls = ((obj.get("metadata") or {}).get("annotations") or {}).get(
                "volume.beta.kubernetes.io/storage-class")
        if cls:
            out[f"{cls}{STORAGE_CLASS_SUFFIX}{PVCS}"] = one()
        req = parse_list(((spec.get("resources") or {}).get("requests")) or {}).get(STORAGE)
        # A resize being processed keeps the larger of the request and what was allocated.
        alloc = parse_list(((obj.get("status") or {}).get("allocatedResources")) or {}).get(STORAGE)
        if alloc is not None and (req is None or alloc.value > req.value):
            req = alloc
        if req is not None:
            out["requests.storage"] = req
            if cls:
                out[f"{cls}{STORAGE_CLASS_SUFFIX}requests.storage"] = req
        return out


POD_RESOURCES = frozenset({object_count_name("", PODS), CPU, MEMORY, EPHEMERAL_STORAGE,
                           "requests.cpu", "requests.memory", "requests.ephemeral-storage",
                           "limits.cpu", "limits.memory", "limits.ephemeral-storage", PODS})
# Quotas on these make every container state them (a historical rule Kubernetes keeps).
POD_VALIDATION_SET = frozenset({CPU, MEMORY, "requests.cpu", "requests.memory", "limits.cpu",
                                "limits.memory"})


def container_resources(c: Mapping[str, Any]) -> tuple[ResourceList, ResourceList]:
    """(requests, limits) of a container.  A limit without a request counts as the request
    too: kube-apiserver's pod defaulting fills such requests in before quota sees them."""
    res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
    requests = parse_list(res.get("requests"))
    limits = parse_list(res.get("limits"))
    for k, v in limits.items():
        requests.setdefault(k, v)
    return requests, limits


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    return [c for c in spec.get(key) or [] if isinstance(c, Mapping)]


def _max_into(acc: ResourceList, other: Mapping[str, Quantity]) -> None:
    for k, v in other.items():
        if k not in acc or v.value > acc[k].value:
            acc[k] = v


def pod_requests_limits(pod: Mapping[str, Any]) -> tuple[ResourceList, ResourceList]:
    """PodRequests / PodLimits: the app containers (and sidecars) add up, each init
    container runs alone with the sidecars started before it (so the pod needs the
    larger), and the pod's overhead comes on top."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    totals: list[ResourceList] = []
    for which in (0, 1):
        acc: ResourceList = {}
        for c in _containers(spec, "containers"):
            acc = add(acc, container_resources(c)[which])
        sidecars: ResourceList = {}
        init_peak: ResourceList = {}
        for c in _containers(spec, "initContainers"):
            mine = container_resources(c)[which]
            if c.get("restartPolicy") == "Always":
                acc = add(acc, mine)
                sidecars = add(sidecars, mine)
                _max_into(init_peak, sidecars)
            else:
                _max_into(init_peak, add(mine, sidecars))
        _max_into(acc, init_peak)
        overhead = parse_list(spec.get("overhead"))
        if which == 0:
            acc = add(acc, overhead)
        elif acc:
            # Overhead counts towards a limit only where the pod has one.
            acc = add(acc, mask(overhead, acc))
        totals.append(acc)
    return totals[0], totals[1]


def compute_usage(requests: Mapping[str, Quantity], limits: Mapping[str, Quantity]) -> ResourceList:
    """podComputeUsageHelper: what requests and limits mean in quota names."""
    out: ResourceList = {PODS: one()}
    for name in (CPU, MEMORY, EPHEMERAL_STORAGE):
        if name in requests:
            out[name] = requests[name]
            out[REQUESTS_PREFIX + name] = requests[name]
        if name in limits:
            out[LIMITS_PREFIX + name] = limits[name]
    for name, q in requests.items():
        if name.startswith(HUGEPAGES_PREFIX):
            out[name] = q
            out[REQUESTS_PREFIX + name] = q
        if is_extended_resource(name):
            out[REQUESTS_PREFIX + name] = q
    return out


def pod_is_terminal_for_quota(pod: Mapping[str, Any], now: float) -> bool:
    """Not QuotaV1Pod: finished pods, and pods whose graceful deletion is overdue (a lost
    node must not hold its namespace's quota), cost no compute quota."""
    if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
        return True
    md = pod.get("metadata") or {}
    ts, grace = md.get("deletionTimestamp"), md.get("deletionGracePeriodSeconds")
    if isinstance(ts, str) and isinstance(grace, int):
        try:
            deadline = meta.parse_rfc3339(ts).timestamp() + grace
        except ValueError:
            return False
        return now > deadline
    return False


def _pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _cross_namespace_affinity(spec: Mapping[str, Any]) -> bool:
    aff = spec.get("affinity") if isinstance(spec.get("affinity"), Mapping) else {}
    for kind in ("podAffinity", "podAntiAffinity"):
        block = aff.get(kind) if isinstance(aff.get(kind), Mapping) else {}
        terms = [t for t in block.get("requiredDuringSchedulingIgnoredDuringExecution") or []
                 if isinstance(t, Mapping)]
        terms += [t.get("podAffinityTerm") for t in block.get("preferredDuringSchedulingIgnoredDuringExecution")
                  or [] if isinstance(t, Mapping) and isinstance(t.get("podAffinityTerm"), Mapping)]
        if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms):
            return True
    return False


class PodEvaluator:
    """Pods: their count and the compute they request or are limited to."""

    group, resource = "", PODS

    def handles(self, verb: str, subresource: str) -> bool:
        # Pods' resources cannot change after creation (no in-place resize here).
        return verb == "create" and not subresource

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n in POD_RESOURCES or n.startswith(HUGEPAGES_PREFIX)
                or n.startswith(REQUESTS_PREFIX + HUGEPAGES_PREFIX) or is_extended_quota_name(n)]

    def matches_scope(self, req: ScopeRequirement, obj: Mapping[str, Any]) -> bool:
        from fleet.api.kinds.pods import qos_class

        spec = _pod_spec(obj)
        terminating = isinstance(spec.get("activeDeadlineSeconds"), int) and spec["activeDeadlineSeconds"] >= 0
        if req.scope == TERMINATING:
            return terminating
        if req.scope == NOT_TERMINATING:
            return not terminating
        if req.scope in (BEST_EFFORT, NOT_BEST_EFFORT):
            best_effort = qos_class(dict(spec)) == "BestEffort"
            return best_effort if req.scope == BEST_EFFORT else not best_effort
        if req.scope == PRIORITY_CLASS:
            pc = spec.get("priorityClassName") or ""
            if req.operator == "Exists":
                return bool(pc)
            if req.operator == "DoesNotExist":
                return not pc
            if req.operator == "In":
                return bool(pc) and pc in req.values
            if req.operator == "NotIn":
                return not pc or pc not in req.values
            return False
        if req.scope == CROSS_NAMESPACE_POD_AFFINITY:
            return _cross_namespace_affinity(spec)
        return False

    def usage(self, obj: Mapping[str, Any], now: float) -> ResourceList:
        out: ResourceList = {object_count_name("", PODS): one()}
        if pod_is_terminal_for_quota(obj, now):
            return out
        requests, limits = pod_requests_limits(obj)
        return add(out, compute_usage(requests, limits))

    def constraints(self, required: Iterable[str], obj: Mapping[str, Any]) -> str | None:
        """The "must specify" rule: with cpu or memory under quota, every container must
        state them (message as kube-apiserver: `must specify cpu for: a,b; memory for: a`)."""
        needed = set(required) & POD_VALIDATION_SET
        if not needed:
            return None
        spec = _pod_spec(obj)
        missing: dict[str, set[str]] = {}
        for c in _containers(spec, "containers") + _containers(spec, "initContainers"):
            have = set(compute_usage(*container_resources(c)))
            for name in needed - have:
                missing.setdefault(name, set()).add(str(c.get("name", "")))
        if not missing:
            return None
        return "must specify " + "; ".join(f"{r} for: {','.join(sorted(missing[r]))}" for r in sorted(missing))


_POD_EVALUATOR = PodEvaluator()
_SERVICE_EVALUATOR = ServiceEvaluator()
_PVC_EVALUATOR = PersistentVolumeClaimEvaluator()


def evaluator_for(group: str, resource: str) -> Evaluator:
    """The evaluator of a resource: the special ones, else an object counter (with the
    legacy alias where one exists)."""
    if group == "":
        if resource == PODS:
            return _POD_EVALUATOR
        if resource == SERVICES:
            return _SERVICE_EVALUATOR
        if resource == PVCS:
            return _PVC_EVALUATOR
        return ObjectCountEvaluator("", resource, LEGACY_COUNT_ALIASES.get(resource))
    return ObjectCountEvaluator(group, resource)


def resources_for_quota_name(name: str) -> tuple[str, str] | None:
    """Which (group, resource) a quota resource name is about, for the controller's
    recount; None for names no evaluator serves."""
    if _POD_EVALUATOR.matching_resources([name]):
        return "", PODS
    if _SERVICE_EVALUATOR.matching_resources([name]):
        return "", SERVICES
    if _PVC_EVALUATOR.matching_resources([name]):
        return "", PVCS
    if name in LEGACY_COUNT_ALIASES:
        return "", name
    return parse_object_count_name(name)


def calculate_usage(evaluator: Evaluator, quota: Mapping[str, Any], objects: Iterable[Mapping[str, Any]],
                    now: float) -> ResourceList:
    """CalculateUsageStats: the quota's resources this evaluator serves, summed over the
    objects its scopes select (zero when none do)."""
    hard = ((quota.get("spec") or {}).get("hard")) or {}
    names = evaluator.matching_resources(hard)
    if not names:
        return {}
    scopes = scope_requirements(quota)
    total: ResourceList = {n: Quantity(Decimal(0)) for n in names}
    for obj in objects:
        if all(evaluator.matches_scope(r, obj) for r in scopes):
            total = add(total, mask(evaluator.usage(obj, now), names))
    return total
