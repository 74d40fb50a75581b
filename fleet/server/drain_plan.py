"""What a node drain does, decided without I/O: its options (`DrainOptions`,
parsed from the POST body), which pods go (`plan_drain`, kubectl drain's
filters and messages), and the drain's progress document kept in the Node's
`fleet.dev/drain-status` annotation.  `drain_runner.py` carries a drain out;
`drain.py` serves the subresources.
"""


from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.api import errors, meta
from fleet.api.owners import controller_of
from fleet.api.validation import as_int, type_invalid

DRAIN_ANNOTATION = "fleet.dev/drain-status"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

RUNNING, COMPLETE, FAILED, TIMED_OUT = "Running", "Complete", "Failed", "TimedOut"

# kubectl's filter messages (k8s.io/kubectl/pkg/drain/filters.go), kept verbatim:
# kfleet drain takes the same flags, and people search for these strings.
DAEMONSET_FATAL = "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)"
DAEMONSET_WARNING = "ignoring DaemonSet-managed Pods"
LOCAL_STORAGE_FATAL = "Pods with local storage (use --delete-emptydir-data to override)"
LOCAL_STORAGE_WARNING = "deleting Pods with local storage"
# kubectl 1.32 prints this one as "cannot delete cannot delete Pods that ..." (its
# constant repeats the prefix its error list adds); Fleet says it once.
UNMANAGED_FATAL = "Pods that declare no controller (use --force to override)"
UNMANAGED_WARNING = "deleting Pods that declare no controller"
CANCELLED = "drain cancelled: the node was made schedulable again"

DRAIN_KIND = {"group": "fleet.dev", "version": "v1", "kind": "NodeDrain"}


@dataclass(frozen=True)
class DrainOptions:
    """The body of `POST nodes/{name}/drain` (kubectl drain's flags, camelCased)."""

    ignoreDaemonSets: bool = False  # noqa: N815 - the JSON field names are the API
    deleteEmptyDirData: bool = False  # noqa: N815
    force: bool = False
    gracePeriodSeconds: int = -1  # noqa: N815 - negative: each pod's own terminationGracePeriodSeconds
    timeoutSeconds: int = 0  # noqa: N815 - 0: no limit (kubectl's default too)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_options(body: Any) -> DrainOptions:
    """DrainOptions from a request body (absent fields take kubectl's defaults); 422 on bad values."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise errors.BadRequest("the body must be a JSON object of drain options")
    causes = []
    values: dict[str, Any] = {}
    for name in ("ignoreDaemonSets", "deleteEmptyDirData", "force"):
        val = body.get(name)
        if val is None:
            continue
        if not isinstance(val, bool):
            causes.append(type_invalid(name, val, "boolean"))
        values[name] = val
    for name in ("gracePeriodSeconds", "timeoutSeconds"):
        val = body.get(name)
        if val is None:
            continue
        if as_int(val) is None:
            causes.append(type_invalid(name, val, "integer"))
        elif name == "timeoutSeconds" and val < 0:
            causes.append(errors.cause(name, f"Invalid value: {val}: must be greater than or equal to 0"))
        values[name] = val
    known = set(DrainOptions.__dataclass_fields__) | {"kind", "apiVersion"}
    for name in body:
        if name not in known:
            causes.append(errors.cause(name, f'unknown field "{name}"', "FieldValueNotSupported"))
    if causes:
        raise errors.Invalid.for_object("NodeDrain", "fleet.dev", "", causes)
    return DrainOptions(**values)


# ----------------------------------------------------------------------------- planning


def pod_key(pod: dict[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _has_local_storage(pod: dict[str, Any]) -> bool:
    return any(isinstance(v, dict) and v.get("emptyDir") is not None
               for v in (pod.get("spec") or {}).get("volumes") or [])


@dataclass
class DrainPlan:
    """What a drain does with the pods on a node, and why (kubectl's filter outcomes)."""

    evict: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # DaemonSet-managed and mirror pods
    warnings: dict[str, list[str]] = field(default_factory=dict)  # message -> pods
    errors: dict[str, list[str]] = field(default_factory=dict)  # message -> pods

    def error_messages(self) -> list[str]:
        return [f"cannot delete {msg}: {', '.join(pods)}" for msg, pods in self.errors.items()]

    def warning_messages(self) -> list[str]:
        return [f"{msg}: {', '.join(pods)}" for msg, pods in self.warnings.items()]


def plan_drain(pods: list[dict[str, Any]], opts: DrainOptions, daemonsets: set[str]) -> DrainPlan:
    """kubectl drain's filters, in kubectl's order, over the pods bound to the node.

    `daemonsets` holds "namespace/name" of the DaemonSets that exist; a pod whose
    controlling DaemonSet is gone is an orphan, deleted only with `force`.  A
    pod stops at the first filter that skips or refuses it.  (kubectl keeps
    only the last filter's warning; Fleet keeps them all.)
    """
    plan = DrainPlan()
    for pod in sorted(pods, key=pod_key):
        key = pod_key(pod)
        md = pod.get("metadata") or {}
        ctrl = controller_of(pod)
        finished = _finished(pod)
        warnings: list[str] = []
        verdict, reason = _filter(pod, md, ctrl, finished, opts, daemonsets, warnings)
        if verdict == "evict":
            plan.evict.append(pod)
        elif verdict == "skip":
            plan.skipped.append(key)
        else:
            plan.errors.setdefault(reason, []).append(key)
        for w in warnings:
            plan.warnings.setdefault(w, []).append(key)
    return plan


def _filter(pod: dict[str, Any], md: dict[str, Any], ctrl: dict[str, Any] | None, finished: bool,
            opts: DrainOptions, daemonsets: set[str], warnings: list[str]) -> tuple[str, str]:
    """One pod through kubectl's filter chain: ("evict" | "skip" | "error", reason)."""
    # daemonSetFilter: the DaemonSet controller ignores cordons and would put the pod back.
    if ctrl is not None and ctrl.get("kind") == "DaemonSet" and not finished:
        name = str(ctrl.get("name", ""))
        if f"{md.get('namespace', '')}/{name}" not in daemonsets:
            if not opts.force:
                return "error", f'daemonsets.apps "{name}" not found'
            warnings.append(f'daemonsets.apps "{name}" not found')
        elif not opts.ignoreDaemonSets:
            return "error", DAEMONSET_FATAL
        else:
            warnings.append(DAEMONSET_WARNING)
            return "skip", ""
    # mirrorPodFilter: static pods belong to their node's agent, not to the API.
    if MIRROR_ANNOTATION in (md.get("annotations") or {}):
        return "skip", ""
    # localStorageFilter: emptyDir data dies with the pod.
    if _has_local_storage(pod) and not finished:
        if not opts.deleteEmptyDirData:
            return "error", LOCAL_STORAGE_FATAL
        warnings.append(LOCAL_STORAGE_WARNING)
    # unreplicatedFilter: nothing would recreate an unmanaged pod elsewhere.
    if not finished and ctrl is None:
        if not opts.force:
            return "error", UNMANAGED_FATAL
        warnings.append(UNMANAGED_WARNING)
    return "evict", ""


# ----------------------------------------------------------------------------- state


def read_state(node: dict[str, Any]) -> dict[str, Any] | None:
    """The drain document in the node's annotation (None: never drained, or unreadable)."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(DRAIN_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def write_state(node: dict[str, Any], state: dict[str, Any]) -> None:
    md = node.setdefault("metadata", {})
    annotations = md.get("annotations")
    if not isinstance(annotations, dict):
        annotations = md["annotations"] = {}
    annotations[DRAIN_ANNOTATION] = json.dumps(state, separators=(",", ":"), sort_keys=True)


def new_state(opts: DrainOptions) -> dict[str, Any]:
    # `id` tells one drain from the next (two may start within the same second).
    return {"id": uuid.uuid4().hex[:12], "phase": RUNNING, "options": opts.to_json(),
            "startTime": meta.now_rfc3339(),
            "completionTime": None, "evicted": [], "remaining": [], "blockedByBudget": [],
            "skipped": [], "warnings": [], "errors": []}


def finish(state: dict[str, Any], phase: str, *problems: str) -> dict[str, Any]:
    state = dict(state, phase=phase, completionTime=meta.now_rfc3339())
    state["errors"] = list(state.get("errors") or []) + list(problems)
    if phase != COMPLETE:
        return state
    state["remaining"] = []
    state["blockedByBudget"] = []
    return state


def drain_document(name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The answer of GET/POST nodes/{name}/drain: the stored state with a type header."""
    return {"kind": DRAIN_KIND["kind"], "apiVersion": f"{DRAIN_KIND['group']}/{DRAIN_KIND['version']}",
            "metadata": {"name": name}, **state}


def _options_of(state: dict[str, Any]) -> DrainOptions:
    try:
        return parse_options(state.get("options") or {})
    except errors.APIError:
        return DrainOptions()


def _deadline_passed(state: dict[str, Any], opts: DrainOptions) -> bool:
    if opts.timeoutSeconds <= 0:
        return False
    try:
        started = meta.parse_rfc3339(state["startTime"])
    except (KeyError, TypeError, ValueError):
        return False
    return (meta.utcnow() - started).total_seconds() >= opts.timeoutSeconds
