"""`metrics.k8s.io/v1beta1` NodeMetrics and PodMetrics: the resource metrics API.

These kinds are never stored.  The API server answers them from the latest
usage it scraped from the nodes' agents (fleet/server/resource_metrics.py),
the way metrics-server answers them in Kubernetes; they are registered here
only so that discovery, tables and name resolution treat them like every
other kind (`kubectl top` first checks that discovery lists the group).
Hence the verbs: `get` and `list`, nothing else.

This module also owns the wire formats of the API, shared by the server that
builds the objects and the HPA controller that reads them: canonical
quantities (cpu in cores with an `n`/`m` suffix, memory in bytes with a
binary suffix, as apimachinery prints them) and Go durations (`window`).

**Simulated usage.**  Simulated nodes (`fleet agent --simulate`) run no
containers, so they have nothing to measure.  A pod bound to one may declare
the usage it pretends to have with two annotations, read at request time:

    fleet.dev/simulate-cpu: "250m"       # the pod's cpu, split evenly over its containers
    fleet.dev/simulate-memory: "64Mi"    # the same for memory (working set)

A running pod without them reports zero usage — nothing runs, so nothing is
used.  This is how the HPA is exercised on simulated nodes: tests (and demos)
set and remove the annotation to put load on and take it off.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fleet.api import quantity
from fleet.api.kinds._common import col, d, dicts, lst
from fleet.api.registry import NAME_COLUMN, KindInfo

Cause = dict[str, str]

GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

SIMULATE_CPU_ANNOTATION = "fleet.dev/simulate-cpu"
SIMULATE_MEMORY_ANNOTATION = "fleet.dev/simulate-memory"
# The label `fleet agent --simulate` puts on its nodes (fleet.agent.simulate.SIMULATED_LABEL;
# repeated here because the server may not import the agent).
SIMULATED_NODE_LABEL = "fleet.dev/simulated"

# ---------------------------------------------------------------------------
# Quantities, printed the way apimachinery canonicalizes them
# ---------------------------------------------------------------------------

_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P",
                     18: "E"}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def format_decimal(value: int, exponent: int = 0) -> str:
    """`value * 10**exponent` as a canonical DecimalSI quantity (`250000000, -9` -> `250m`).

    The largest suffix that keeps the number whole wins, as in Go's
    `Quantity.String()`: 1500m stays `1500m`, 2000m becomes `2`.
    """
    if value == 0:
        return "0"
    exp = exponent
    while exp + 3 in _DECIMAL_SUFFIXES and value % 1000 == 0:
        value //= 1000
        exp += 3
    # Exponents below nano (never produced here) would have no suffix: fall back to e-notation.
    suffix = _DECIMAL_SUFFIXES.get(exp)
    return f"{value}{suffix}" if suffix is not None else f"{value}e{exp}"


def format_bytes(value: int) -> str:
    """Bytes as a canonical BinarySI quantity (`67108864` -> `64Mi`, `1536` -> `1536`).

    As in Go, values below 1024 print in decimal form (`1000` -> `1k`).
    """
    if -1024 < value < 1024:
        return format_decimal(value)
    i = 0
    while value % 1024 == 0 and i < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        i += 1
    return f"{value}{_BINARY_SUFFIXES[i]}"


def canonical_quantity(value: Any) -> str:
    """A quantity as kube-apiserver hands it back: `0.5` -> `500m`, `1024Mi` -> `1Gi`.

    Binary suffixes keep a binary form (when the value is a whole number of at
    least 1024); everything else is printed in decimal form with nano precision,
    rounded up, as apimachinery does.  Strings that are not quantities come back
    unchanged (validation reports them).
    """
    try:
        q = quantity.parse_quantity(value)
    except quantity.QuantityError:
        return str(value)
    binary = isinstance(value, str) and value.rstrip().endswith("i")
    if binary and q == q.to_integral_value() and abs(q) >= 1024:
        return format_bytes(int(q))
    return format_decimal(math.ceil(q * 1_000_000_000), -9)


def format_cpu(nanocores: int) -> str:
    """Cores, from nanocores (metrics-server reports cpu with nano precision)."""
    return format_decimal(max(0, nanocores), -9)


def format_milli(milli: int) -> str:
    """A milli-value as `resource.NewMilliQuantity(v, DecimalSI)` prints it (HPA status)."""
    return format_decimal(milli, -3)


# ---------------------------------------------------------------------------
# Go durations (metav1.Duration, the `window` field)
# ---------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}


def format_duration(seconds: float) -> str:
    """Go's `time.Duration.String()` for a non-negative number of seconds (`75.5` -> `1m15.5s`)."""
    ns = round(seconds * 1e9)
    if ns <= 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return _trim(ns / size) + unit
    h, rest = divmod(ns, 3_600_000_000_000)
    m, rest = divmod(rest, 60_000_000_000)
    s = _trim(rest / 1e9) + "s"
    if h:
        return f"{h}h{m}m{s}"
    if m:
        return f"{m}m{s}"
    return s


def _trim(x: float) -> str:
    text = f"{x:.9f}".rstrip("0").rstrip(".")
    return text or "0"


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string (`15s`, `1m0.5s`, `500ms`); ValueError if malformed."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"invalid duration {text!r}")
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_NS[m.group(2)] / 1e9
        pos = m.end()
    if pos != len(text):
        raise ValueError(f"invalid duration {text!r}")
    return total


# ---------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------


def usage(cpu_nanocores: int, memory_bytes: int) -> dict[str, str]:
    return {"cpu": format_cpu(cpu_nanocores), "memory": format_bytes(max(0, memory_bytes))}


def node_metrics(node: dict[str, Any], cpu_nanocores: int, memory_bytes: int, *,
                 timestamp: str, window: float, now: str) -> dict[str, Any]:
    """A NodeMetrics for `node` (its name and labels, as metrics-server copies them)."""
    md = d(node, "metadata")
    meta: dict[str, Any] = {"name": md.get("name", ""), "creationTimestamp": now}
    if md.get("labels"):
        meta["labels"] = dict(md["labels"])
    return {"kind": "NodeMetrics", "apiVersion": API_VERSION, "metadata": meta,
            "timestamp": timestamp, "window": format_duration(window),
            "usage": usage(cpu_nanocores, memory_bytes)}


def pod_metrics(pod: dict[str, Any], containers: list[tuple[str, int, int]], *,
                timestamp: str, window: float, now: str) -> dict[str, Any]:
    """A PodMetrics for `pod`; `containers` is [(name, cpu nanocores, memory bytes)]."""
    md = d(pod, "metadata")
    meta: dict[str, Any] = {"name": md.get("name", ""), "namespace": md.get("namespace", ""),
                            "creationTimestamp": now}
    if md.get("labels"):
        meta["labels"] = dict(md["labels"])
    return {"kind": "PodMetrics", "apiVersion": API_VERSION, "metadata": meta,
            "timestamp": timestamp, "window": format_duration(window),
            "containers": [{"name": name, "usage": usage(cpu, mem)}
                           for name, cpu, mem in containers]}


def simulated_usage(pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    """[(container, cpu nanocores, memory bytes)] a pod on a simulated node declares.

    The pod-level annotations are split evenly over the app containers (the
    first ones take the remainder); malformed or missing values count as zero.
    """
    ann = d(pod, "metadata", "annotations")
    names = [str(c.get("name", "")) for c in dicts(lst(pod, "spec", "containers"))]
    if not names:
        return []
    cpu = _annotation_amount(ann.get(SIMULATE_CPU_ANNOTATION), 1_000_000_000)
    mem = _annotation_amount(ann.get(SIMULATE_MEMORY_ANNOTATION), 1)
    n = len(names)
    return [(name, cpu // n + (1 if i < cpu % n else 0), mem // n + (1 if i < mem % n else 0))
            for i, name in enumerate(names)]


def _annotation_amount(raw: Any, scale: int) -> int:
    if not isinstance(raw, str) or not raw:
        return 0
    try:
        q = quantity.parse_quantity(raw.strip())
    except quantity.QuantityError:
        return 0
    return max(0, int(q * scale))


def is_simulated_node(node: dict[str, Any] | None) -> bool:
    return d(node, "metadata", "labels").get(SIMULATED_NODE_LABEL) == "true"


# ---------------------------------------------------------------------------
# Kinds
# ---------------------------------------------------------------------------


def _read_only(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Never reached through the API (the kinds have no write verbs); kept so every kind
    has a validator, which generic code may call."""
    return []


def _sum_containers(o: dict[str, Any], resource: str) -> str:
    # A PodMetrics row shows the pod's total, like metrics-server's table.
    total = 0
    for c in dicts(lst(o, "containers")):
        raw = d(c, "usage").get(resource)
        try:
            value = quantity.parse_quantity(raw)
        except quantity.QuantityError:
            continue
        total += int(value * (1_000_000_000 if resource == "cpu" else 1))
    return format_cpu(total) if resource == "cpu" else format_bytes(total)


_WINDOW = col("Window", lambda o: o.get("window", ""),
              description="Window is the time window the usage was averaged over.")

NODE_METRICS = KindInfo(
    group=GROUP, version=VERSION, kind="NodeMetrics", plural="nodes", singular="",
    namespaced=False, verbs=("get", "list"),
    columns_override=(
        NAME_COLUMN,
        col("CPU", lambda o: d(o, "usage").get("cpu", ""), description="CPU usage in cores."),
        col("Memory", lambda o: d(o, "usage").get("memory", ""),
            description="Memory (working set) usage in bytes."),
        _WINDOW,
    ),
    validate=_read_only,
)

POD_METRICS = KindInfo(
    group=GROUP, version=VERSION, kind="PodMetrics", plural="pods", singular="",
    verbs=("get", "list"),
    columns_override=(
        NAME_COLUMN,
        col("CPU", lambda o: _sum_containers(o, "cpu"), description="CPU usage in cores."),
        col("Memory", lambda o: _sum_containers(o, "memory"),
            description="Memory (working set) usage in bytes."),
        _WINDOW,
    ),
    validate=_read_only,
)

KINDS = (NODE_METRICS, POD_METRICS)

__all__ = [
    "API_VERSION", "GROUP", "KINDS", "NODE_METRICS", "POD_METRICS",
    "SIMULATED_NODE_LABEL", "SIMULATE_CPU_ANNOTATION", "SIMULATE_MEMORY_ANNOTATION", "VERSION",
    "canonical_quantity", "format_bytes", "format_cpu", "format_decimal", "format_duration", "format_milli",
    "is_simulated_node", "node_metrics", "parse_duration", "pod_metrics", "simulated_usage",
    "usage",
]
