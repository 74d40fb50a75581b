"""`fleet.dev/v1` ProcessControl: the per-namespace consent to reach into containers,
and `PodSignal`, the body of Fleet's `POST pods/{name}/signal`.

Fleet replaces SSH with mediated, audited process control behind three gates: RBAC
verbs on the subresources (`create` on pods/exec|attach|portforward as Kubernetes,
Fleet's own `signal` on pods/signal), this consent object, and the admission chain.
Where the consent gate is on (`fleet server --hardened` or
`--process-control-consent`), a namespace with no ProcessControl allowing the
request allows no exec, attach, port-forward or signal at all, whatever RBAC says;
with the gate off (the development default) RBAC alone decides, as in Kubernetes.

    apiVersion: fleet.dev/v1
    kind: ProcessControl
    metadata: {name: oncall, namespace: shop}
    spec:
      subjects:                      # who (any one matches)
      - {kind: User, name: alice}
      - {kind: Group, name: sre}
      - {kind: ServiceAccount, name: debugger, namespace: shop}   # namespace defaults to the object's
      actions: [exec, attach, portforward, signal]
      signals: [SIGHUP, SIGUSR1]     # for `signal`; empty = any signal
      podSelector: {matchLabels: {app: web}}   # absent = every pod of the namespace
      containers: [web]              # empty = every container

Subjects are rbac.authorization.k8s.io Subjects (kind User/Group/ServiceAccount), so
what a RoleBinding says about "who" reads the same here.  `portforward` names no
container (pods/portforward is per pod), so `containers` does not restrict it.

What is decided here is pure (`validate`, `allowing`): the server reads the
namespace's objects (fleet/server/processcontrol.py) and asks.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.api.kinds._common import col, d, lst
from fleet.api.registry import KindInfo
from fleet.api.selectors import selector_dict_matches
from fleet.api.validation import (
    Cause,
    duplicate,
    invalid,
    is_dns1123_label,
    not_supported,
    required,
    validate_label_selector,
    validate_object_meta,
)

GROUP = "fleet.dev"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ProcessControl"
SIGNAL_KIND = "PodSignal"

EXEC, ATTACH, PORTFORWARD, SIGNAL = "exec", "attach", "portforward", "signal"
ACTIONS = (EXEC, ATTACH, PORTFORWARD, SIGNAL)
SUBJECT_KINDS = ("User", "Group", "ServiceAccount")

# Signals a client may name: every catchable Linux signal by its name (SIGHUP) or
# number; SIGKILL and SIGSTOP too (an operator's last resort), but never the realtime
# range — nothing sends those by hand.
SIGNALS: dict[str, int] = {
    s.name: int(s) for s in _signal.Signals
    if s.name.startswith("SIG") and not s.name.startswith("SIG_") and int(s) < _signal.SIGRTMIN
}


def parse_signal(value: Any) -> int | None:
    """The signal number of `SIGHUP`, `HUP`, `hup` or `1`; None when it is none of those."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value in SIGNALS.values() else None
    if not isinstance(value, str) or not value:
        return None
    if value.isdigit():
        return parse_signal(int(value))
    name = value.upper()
    return SIGNALS.get(name if name.startswith("SIG") else "SIG" + name)


def signal_name(num: int) -> str:
    return _signal.Signals(num).name


# ---------------------------------------------------------------------------- validation


def _validate_subjects(subjects: Any, path: str) -> list[Cause]:
    if subjects is None or subjects == []:
        return [required(path, "at least one subject is required")]
    if not isinstance(subjects, list):
        return [invalid(path, subjects, "must be a list of subjects")]
    out: list[Cause] = []
    for i, s in enumerate(subjects):
        p = f"{path}[{i}]"
        if not isinstance(s, dict):
            out.append(invalid(p, s, "must be an object"))
            continue
        kind, name = s.get("kind"), s.get("name")
        if kind not in SUBJECT_KINDS:
            out.append(not_supported(f"{p}.kind", kind, SUBJECT_KINDS) if kind
                       else required(f"{p}.kind"))
        if not isinstance(name, str) or not name:
            out.append(required(f"{p}.name"))
        elif kind == "ServiceAccount":
            out += [invalid(f"{p}.name", name, m) for m in is_dns1123_label(name)]
        ns = s.get("namespace")
        if ns is not None and kind != "ServiceAccount":
            out.append(invalid(f"{p}.namespace", ns, "only ServiceAccount subjects have a namespace"))
        elif ns is not None and (not isinstance(ns, str) or is_dns1123_label(ns)):
            out.append(invalid(f"{p}.namespace", ns, "must be a namespace name"))
    return out


def _validate_strings(values: Any, path: str) -> list[Cause]:
    if values is None:
        return []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return [invalid(path, values, "must be a list of strings")]
    seen: set[str] = set()
    out: list[Cause] = []
    for i, v in enumerate(values):
        if v in seen:
            out.append(duplicate(f"{path}[{i}]", v))
        seen.add(v)
    return out


def validate(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """Field errors for a ProcessControl, as apimachinery words them."""
    out = validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*out, required("spec")]
    out += _validate_subjects(spec.get("subjects"), "spec.subjects")
    actions = spec.get("actions")
    if not actions:
        out.append(required("spec.actions", "at least one action is required"))
    else:
        out += _validate_strings(actions, "spec.actions")
        if isinstance(actions, list):
            out += [not_supported(f"spec.actions[{i}]", a, ACTIONS)
                    for i, a in enumerate(actions) if isinstance(a, str) and a not in ACTIONS]
    signals = spec.get("signals")
    out += _validate_strings(signals, "spec.signals")
    if isinstance(signals, list):
        out += [invalid(f"spec.signals[{i}]", s, "not a known signal name (SIGHUP, SIGTERM, ...)")
                for i, s in enumerate(signals) if isinstance(s, str) and parse_signal(s) is None]
        if signals and isinstance(actions, list) and SIGNAL not in actions:
            out.append(invalid("spec.signals", signals, f'requires "{SIGNAL}" in spec.actions'))
    containers = spec.get("containers")
    out += _validate_strings(containers, "spec.containers")
    if isinstance(containers, list):
        out += [invalid(f"spec.containers[{i}]", c, m)
                for i, c in enumerate(containers) if isinstance(c, str) for m in is_dns1123_label(c)]
    if spec.get("podSelector") is not None:
        out += validate_label_selector(spec.get("podSelector"), "spec.podSelector")
    return out


def validate_signal_request(body: Any) -> list[Cause]:
    """Field errors for a PodSignal body."""
    if not isinstance(body, dict):
        return [invalid("", body, "must be a PodSignal object")]
    out: list[Cause] = []
    sig = body.get("signal")
    if sig in (None, ""):
        out.append(required("signal"))
    elif parse_signal(sig) is None:
        out.append(invalid("signal", sig, "unknown signal; use a name such as SIGHUP or SIGTERM"))
    container = body.get("container")
    if container is not None and not isinstance(container, str):
        out.append(invalid("container", container, "must be a string"))
    return out


# ---------------------------------------------------------------------------- matching


@dataclass(frozen=True)
class Request:
    """One process-control request, as the consent gate sees it."""

    action: str  # exec | attach | portforward | signal
    namespace: str
    user: str
    groups: tuple[str, ...]
    pod_labels: Mapping[str, str]
    container: str = ""  # "" for portforward
    signal: str = ""  # the canonical name (SIGHUP) for a signal request


def _subject_matches(subject: Mapping[str, Any], req: Request, default_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == req.user
    if kind == "Group":
        return name in req.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or default_ns
        return req.user == f"system:serviceaccount:{ns}:{name}"
    return False


def allows(pc: Mapping[str, Any], req: Request) -> bool:
    """Whether the ProcessControl `pc` consents to `req` (all of its parts must match)."""
    spec = d(pc, "spec")
    meta = d(pc, "metadata")
    if meta.get("namespace", req.namespace) != req.namespace:
        return False
    if req.action not in lst(spec, "actions"):
        return False
    if not any(_subject_matches(s, req, req.namespace) for s in lst(spec, "subjects") if isinstance(s, dict)):
        return False
    # Absent: every pod of the namespace ({} selects everything as well).
    if "podSelector" in spec and spec["podSelector"] is not None \
            and not selector_dict_matches(spec["podSelector"], req.pod_labels):
        return False
    containers = lst(spec, "containers")
    if containers and req.action != PORTFORWARD and req.container not in containers:
        return False
    if req.action == SIGNAL:
        signals = lst(spec, "signals")
        wanted = parse_signal(req.signal)
        if signals and wanted not in {parse_signal(s) for s in signals}:
            return False
    return True


def allowing(objects: Iterable[Mapping[str, Any]], req: Request) -> str | None:
    """The name of the first (by name) ProcessControl consenting to `req`, or None."""
    for pc in sorted(objects, key=lambda o: d(o, "metadata").get("name", "")):
        if allows(pc, req):
            return str(d(pc, "metadata").get("name", ""))
    return None


def refusal_message(pod: str, req: Request) -> str:
    """The 403's message: what is missing, in apierrors.NewForbidden's shape."""
    what = {EXEC: "exec in", ATTACH: "attach to", PORTFORWARD: "port-forward to",
            SIGNAL: f"send {req.signal or 'a signal'} to"}[req.action]
    target = f'container "{req.container}"' if req.container else f'pod "{pod}"'
    return (f'pods "{pod}" is forbidden: no ProcessControl in namespace "{req.namespace}" allows '
            f'user "{req.user}" to {what} {target}')


# ---------------------------------------------------------------------------- the kind


def _join(values: Sequence[Any]) -> str:
    return ",".join(str(v) for v in values) if values else "<all>"


def _subjects_cell(o: dict[str, Any]) -> str:
    return ",".join(f"{s.get('kind', '')}/{s.get('name', '')}" for s in lst(o, "spec", "subjects")
                    if isinstance(s, dict))


def _default(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for s in spec.get("subjects") or []:
        if isinstance(s, dict) and s.get("kind") == "ServiceAccount" and not s.get("namespace"):
            ns = d(obj, "metadata").get("namespace")
            if ns:
                s["namespace"] = ns


PROCESS_CONTROL = KindInfo(
    group=GROUP, version=VERSION, kind=KIND, plural="processcontrols", singular="processcontrol",
    short_names=("pctl",),  # "pc" is PriorityClass's
    columns=(
        col("Subjects", _subjects_cell, description="Who may act (kind/name)."),
        col("Actions", lambda o: _join(lst(o, "spec", "actions")),
            description="exec, attach, portforward, signal."),
        col("Containers", lambda o: _join(lst(o, "spec", "containers")),
            description="Containers covered; <all> when empty."),
        col("Signals", lambda o: _join(lst(o, "spec", "signals")), priority=1,
            description="Signals allowed for the signal action; <all> when empty."),
    ),
    default=_default,
    validate=validate,
    patch_schema={},
    strategic_merge=False,
)

KINDS = (PROCESS_CONTROL,)

__all__ = [
    "ACTIONS", "API_VERSION", "ATTACH", "EXEC", "GROUP", "KIND", "KINDS", "PORTFORWARD",
    "PROCESS_CONTROL", "Request", "SIGNAL", "SIGNALS", "SIGNAL_KIND", "VERSION", "allowing", "allows",
    "parse_signal", "refusal_message", "signal_name", "validate", "validate_signal_request",
]
