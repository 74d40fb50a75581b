"""A container's environment, resolved the way the kubelet resolves it.

The pod worker calls `resolve_env` right before it starts a container and passes the
result to the runtime.  Kubernetes' order matters and is kept exactly:

1. `base_env` (the caller's service-link variables, if any) — lowest priority;
2. `envFrom` sources in order: every key of a ConfigMap's `data` or a Secret's `data`
   (base64-decoded), with the source's `prefix`;
3. `env` entries in order, each one overriding what came before: a literal `value` with
   `$(VAR)` references to variables defined *earlier* expanded (`$$` escapes a `$`,
   unknown references stay verbatim), or a `valueFrom` (configMapKeyRef, secretKeyRef,
   fieldRef, resourceFieldRef).

A reference to a ConfigMap, Secret or key that does not exist and is not `optional`
fails the whole container start with `EnvError` — reason `CreateContainerConfigError`
and the kubelet's own message (`configmap "x" not found`), which the worker puts into
the container's waiting state and retries on the next sync.

The fieldRef and resourceFieldRef logic (`field_value`, `resource_value`) is shared with
downwardAPI volumes (`fleet.agent.volumes`).  `$(VAR)` expansion, here and in the
worker's `command`/`args` and volumes' `subPathExpr`, is `fleet.api.expansion`.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Literal

from fleet.api.expansion import expand_vars
from fleet.api.quantity import QuantityError, parse_quantity

log = logging.getLogger(__name__)

# lookup(kind, namespace, name) -> the object (a ConfigMap or Secret dict) or None.
Lookup = Callable[[Literal["ConfigMap", "Secret"], str, str], Awaitable[dict[str, Any] | None]]

CONFIG_ERROR = "CreateContainerConfigError"


class EnvError(Exception):
    """The environment cannot be built; `reason`/`message` go into the container status."""

    def __init__(self, message: str, reason: str = CONFIG_ERROR) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---------------------------------------------------------------------------------------
# Object lookups


def _decode_secret_value(value: str) -> str:
    # Environment values are bytes to the kernel; surrogateescape keeps any non-UTF-8
    # secret byte-exact through os.fsencode when the runtime writes the env.
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError) as e:
        raise EnvError(f"secret value is not valid base64: {e}") from None


def config_map_data(obj: Mapping[str, Any]) -> dict[str, str]:
    """The string data of a ConfigMap (binaryData is not usable as text, as in Kubernetes)."""
    return {k: str(v) for k, v in (obj.get("data") or {}).items()}


def secret_data(obj: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's data, base64-decoded (stringData too, in case it was not folded in)."""
    out = {k: _decode_secret_value(v) for k, v in (obj.get("data") or {}).items()}
    out.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
    return out


class _Cache:
    """One resolve's view of ConfigMaps/Secrets, so a source referenced twice is read once."""

    def __init__(self, lookup: Lookup, namespace: str) -> None:
        self._lookup = lookup
        self._ns = namespace
        self._seen: dict[tuple[str, str], dict[str, str] | None] = {}

    async def get(self, kind: Literal["ConfigMap", "Secret"], name: str) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self._seen:
            obj = await self._lookup(kind, self._ns, name)
            if obj is None:
                self._seen[key] = None
            else:
                self._seen[key] = config_map_data(obj) if kind == "ConfigMap" else secret_data(obj)
        return self._seen[key]


def _not_found(kind: str, name: str) -> EnvError:
    return EnvError(f'{kind.lower()} "{name}" not found')


# ---------------------------------------------------------------------------------------
# fieldRef / resourceFieldRef

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")


def _format_map(m: Mapping[str, str]) -> str:
    # The downward API's rendering of a whole map: sorted `key="value"` lines, values
    # quoted Go-style (strconv.Quote), which json.dumps matches for everything printable.
    return "\n".join(f"{k}={json.dumps(m[k], ensure_ascii=False)}" for k in sorted(m))


def field_value(pod: Mapping[str, Any], field_path: str, *,
                pod_ips: Sequence[str] | None = None,
                host_ips: Sequence[str] | None = None,
                allow_whole_maps: bool = False) -> str:
    """The value of a downward-API `fieldRef.fieldPath` for `pod`.

    `pod_ips`/`host_ips` override the pod's status, because the worker knows the
    sandbox's addresses before it has reported them to the API server (as the kubelet
    does).  Whole `metadata.labels`/`metadata.annotations` are allowed only in volumes."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if pod_ips is None:
        pod_ips = [p.get("ip", "") for p in status.get("podIPs") or []] or (
            [status["podIP"]] if status.get("podIP") else [])
    if host_ips is None:
        host_ips = [p.get("ip", "") for p in status.get("hostIPs") or []] or (
            [status["hostIP"]] if status.get("hostIP") else [])
    m = _SUBSCRIPT.match(field_path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    match field_path:
        case "metadata.name":
            return str(meta.get("name", ""))
        case "metadata.namespace":
            return str(meta.get("namespace", ""))
        case "metadata.uid":
            return str(meta.get("uid", ""))
        case "metadata.labels" | "metadata.annotations" if allow_whole_maps:
            return _format_map(meta.get(field_path.split(".")[1]) or {})
        case "spec.nodeName":
            return str(spec.get("nodeName", ""))
        case "spec.serviceAccountName":
            return str(spec.get("serviceAccountName", ""))
        case "status.podIP":
            return pod_ips[0] if pod_ips else ""
        case "status.podIPs":
            return ",".join(pod_ips)
        case "status.hostIP":
            return host_ips[0] if host_ips else ""
        case "status.hostIPs":
            return ",".join(host_ips)
    raise EnvError(f"unsupported fieldPath: {field_path}")


_RESOURCES = {"cpu", "memory", "ephemeral-storage"}


def resource_value(pod: Mapping[str, Any], container_name: str, resource: str,
                   divisor: str | int | float | None,
                   node_allocatable: Mapping[str, Any] | None) -> str:
    """The value of a `resourceFieldRef`, as the kubelet computes it.

    An unset limit falls back to the node's allocatable amount (a container without a
    limit may use the whole node).  CPU is counted in millicores and memory in bytes,
    each divided by `divisor` and rounded *up*, so `limits.cpu: 500m` with the default
    divisor of 1 reads as `1`."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    container = next((c for c in containers if c.get("name") == container_name), None)
    if container is None:
        raise EnvError(f'resourceFieldRef: container "{container_name}" not found in pod')
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not (name in _RESOURCES or name.startswith("hugepages-")):
        raise EnvError(f"unsupported container resource: {resource}")
    amounts = (container.get("resources") or {}).get(kind) or {}
    raw = amounts.get(name)
    if raw is None and kind == "limits":
        raw = (node_allocatable or {}).get(name)
    try:
        value = parse_quantity(raw) if raw is not None else Decimal(0)
        div = parse_quantity(divisor if divisor not in (None, "") else "1")  # type: ignore[arg-type]
    except QuantityError as e:
        raise EnvError(f"resourceFieldRef {resource}: {e}") from None
    if div <= 0:
        raise EnvError(f"resourceFieldRef {resource}: divisor must be positive")
    if name == "cpu":
        # Kubernetes divides MilliValue()s, so a divisor below 1m counts as 1m.
        millis = math.ceil(value * 1000)
        div_millis = max(math.ceil(div * 1000), 1)
        return str(-(-millis // div_millis))
    # Integer ceiling division: exact for any size, unlike float division.
    return str(-(-math.ceil(value) // max(math.ceil(div), 1)))


# ---------------------------------------------------------------------------------------
# The environment


def _valid_env_name(name: str) -> bool:
    # Kubernetes (since 1.30) accepts any printable ASCII except '='.
    return bool(name) and all(" " <= ch <= "~" for ch in name) and "=" not in name


async def resolve_env(pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup, *,
                      node_allocatable: Mapping[str, Any] | None = None,
                      pod_ips: Sequence[str] | None = None,
                      host_ips: Sequence[str] | None = None,
                      base_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of `container` in `pod`; raises `EnvError` on a missing reference."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    cache = _Cache(lookup, namespace)
    env: dict[str, str] = dict(base_env or {})

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        if "configMapRef" in source:
            ref, kind = source["configMapRef"] or {}, "ConfigMap"
        elif "secretRef" in source:
            ref, kind = source["secretRef"] or {}, "Secret"
        else:
            continue
        data = await cache.get(kind, ref.get("name", ""))  # type: ignore[arg-type]
        if data is None:
            if ref.get("optional"):
                continue
            raise _not_found(kind, ref.get("name", ""))
        for key, value in data.items():
            name = prefix + key
            if not _valid_env_name(name):
                # The kubelet skips such keys with an event instead of failing the pod.
                log.warning("skipping invalid env name %r from %s %s/%s", name, kind,
                            namespace, ref.get("name"))
                continue
            env[name] = value

    for entry in container.get("env") or []:
        name = entry.get("name", "")
        value_from = entry.get("valueFrom")
        if value_from is None:
            env[name] = expand_vars(str(entry.get("value") or ""), env)
            continue
        value = await _value_from(pod, container, value_from, cache, namespace,
                                  node_allocatable=node_allocatable,
                                  pod_ips=pod_ips, host_ips=host_ips)
        if value is not None:
            env[name] = value
    return env


async def _value_from(pod: Mapping[str, Any], container: Mapping[str, Any],
                      value_from: Mapping[str, Any], cache: _Cache, namespace: str, *,
                      node_allocatable: Mapping[str, Any] | None,
                      pod_ips: Sequence[str] | None,
                      host_ips: Sequence[str] | None) -> str | None:
    """One `valueFrom`; None means "optional and absent: leave the variable unset"."""
    for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        ref = value_from.get(field)
        if ref is None:
            continue
        obj_name, key = ref.get("name", ""), ref.get("key", "")
        data = await cache.get(kind, obj_name)  # type: ignore[arg-type]
        if data is None:
            if ref.get("optional"):
                return None
            raise _not_found(kind, obj_name)
        if key not in data:
            if ref.get("optional"):
                return None
            raise EnvError(f"couldn't find key {key} in {kind} {namespace}/{obj_name}")
        return data[key]
    if "fieldRef" in value_from:
        return field_value(pod, (value_from["fieldRef"] or {}).get("fieldPath", ""),
                           pod_ips=pod_ips, host_ips=host_ips)
    if "resourceFieldRef" in value_from:
        ref = value_from["resourceFieldRef"] or {}
        return resource_value(pod, ref.get("containerName") or container.get("name", ""),
                              ref.get("resource", ""), ref.get("divisor"), node_allocatable)
    raise EnvError("valueFrom has no source")
