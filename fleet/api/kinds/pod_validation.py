"""Validation of the pod spec, worded the way kube-apiserver words it.

Beside the pod kind because it is the pod's: a Pod's `spec`, and the pod
templates of Deployments, ReplicaSets, StatefulSets, DaemonSets and Jobs
(`validate_pod_template`), go through `validate_pod_spec` — containers and
their probes, env, ports and resources, volumes, tolerations, node and pod
affinity, topology spread constraints.  The validators every kind shares
(causes, names, labels, metadata, selectors, quantities) are
`fleet.api.validation`.

As there, every validator takes untrusted JSON and reports a wrong type as a
cause instead of raising.
"""

from __future__ import annotations

import json
from typing import Any

from fleet.api.errors import BadRequest, cause
from fleet.api.selectors import parsed_label_selector
from fleet.api.validation import (
    PROTOCOLS,
    TAINT_EFFECTS,
    Cause,
    as_int,
    duplicate,
    forbidden,
    invalid,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_env_var_name,
    is_valid_label_value,
    is_valid_port_name,
    is_valid_port_num,
    nonnegative,
    not_found,
    not_supported,
    positive,
    required,
    selector_is_empty,
    type_invalid,
    validate_annotations,
    validate_label_name,
    validate_label_selector,
    validate_labels,
    validate_preemption_policy,
    validate_resources,
)

# ---------------------------------------------------------------------------
# Pod spec.
# ---------------------------------------------------------------------------

RESTART_POLICIES = ("Always", "OnFailure", "Never")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TERMINATION_MESSAGE_POLICIES = ("File", "FallbackToLogsOnError")
PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
LIFECYCLE_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")


def _check_port_ref(port: Any, path: str, out: list[Cause]) -> None:
    """An IntOrString port: a number 1..65535 or an IANA service name."""
    if port is None:
        out.append(required(path))
    elif isinstance(port, str):
        for msg in is_valid_port_name(port):
            out.append(invalid(path, port, msg))
    else:
        for msg in is_valid_port_num(port):
            out.append(invalid(path, port, msg))


def _validate_handler(h: dict[str, Any], path: str, allowed: tuple[str, ...],
                      out: list[Cause]) -> None:
    present = [k for k in allowed if h.get(k) is not None]
    if not present:
        out.append(required(path, "must specify a handler type"))
        return
    for extra in present[1:]:
        out.append(forbidden(f"{path}.{extra}", "may not specify more than 1 handler type"))
    kind = present[0]
    hp = f"{path}.{kind}"
    body = h[kind]
    if not isinstance(body, dict):
        out.append(type_invalid(hp, body, "object"))
        return
    if kind == "exec":
        cmd = body.get("command")
        if not cmd:
            out.append(required(f"{hp}.command"))
        elif not isinstance(cmd, list) or not all(isinstance(c, str) for c in cmd):
            out.append(type_invalid(f"{hp}.command", cmd, "array of strings"))
    elif kind in ("httpGet", "tcpSocket"):
        _check_port_ref(body.get("port"), f"{hp}.port", out)
        if kind == "httpGet":
            scheme = body.get("scheme")
            if scheme is not None and scheme not in ("HTTP", "HTTPS"):
                out.append(not_supported(f"{hp}.scheme", scheme, ("HTTP", "HTTPS")))
    elif kind == "grpc":
        port = body.get("port")
        if port is None:
            out.append(required(f"{hp}.port"))
        else:
            for msg in is_valid_port_num(port):
                out.append(invalid(f"{hp}.port", port, msg))
    elif kind == "sleep":
        positive(body, "seconds", f"{hp}.seconds", out)


def validate_probe(probe: Any, path: str, *, liveness_or_startup: bool = False) -> list[Cause]:
    if probe is None:
        return []
    if not isinstance(probe, dict):
        return [type_invalid(path, probe, "object")]
    out: list[Cause] = []
    _validate_handler(probe, path, PROBE_HANDLERS, out)
    for key in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold",
                "failureThreshold", "terminationGracePeriodSeconds"):
        nonnegative(probe, key, f"{path}.{key}", out)
    # Liveness and startup probes decide "dead or alive" on a single success,
    # so Kubernetes pins their successThreshold to 1.
    st = probe.get("successThreshold")
    if liveness_or_startup and as_int(st) is not None and st != 1:
        out.append(invalid(f"{path}.successThreshold", st, "must be 1"))
    return out


def _validate_env(env: Any, path: str, out: list[Cause]) -> None:
    if env is None:
        return
    if not isinstance(env, list):
        out.append(type_invalid(path, env, "array"))
        return
    for i, e in enumerate(env):
        ep = f"{path}[{i}]"
        if not isinstance(e, dict):
            out.append(type_invalid(ep, e, "object"))
            continue
        name = e.get("name")
        if not name:
            out.append(required(f"{ep}.name"))
        elif not isinstance(name, str):
            out.append(type_invalid(f"{ep}.name", name, "string"))
        else:
            for msg in is_env_var_name(name):
                out.append(invalid(f"{ep}.name", name, msg))
        if e.get("value") is not None and e.get("valueFrom") is not None:
            out.append(invalid(f"{ep}.valueFrom", "", "may not be specified when `value` is not empty"))
        vf = e.get("valueFrom")
        if vf is not None:
            if not isinstance(vf, dict):
                out.append(type_invalid(f"{ep}.valueFrom", vf, "object"))
                continue
            sources = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
                       if vf.get(k) is not None]
            if len(sources) != 1:
                out.append(invalid(f"{ep}.valueFrom", "",
                                   "must specify one of: `fieldRef`, `resourceFieldRef`, "
                                   "`configMapKeyRef` or `secretKeyRef`"))
            for src in ("configMapKeyRef", "secretKeyRef"):
                ref = vf.get(src)
                if isinstance(ref, dict) and not ref.get("key"):
                    out.append(required(f"{ep}.valueFrom.{src}.key"))


def _validate_ports(ports: Any, path: str, out: list[Cause]) -> None:
    if ports is None:
        return
    if not isinstance(ports, list):
        out.append(type_invalid(path, ports, "array"))
        return
    names: set[str] = set()
    for i, p in enumerate(ports):
        pp = f"{path}[{i}]"
        if not isinstance(p, dict):
            out.append(type_invalid(pp, p, "object"))
            continue
        name = p.get("name")
        if name:
            if not isinstance(name, str):
                out.append(type_invalid(f"{pp}.name", name, "string"))
            else:
                for msg in is_valid_port_name(name):
                    out.append(invalid(f"{pp}.name", name, msg))
                if name in names:
                    out.append(duplicate(f"{pp}.name", name))
                names.add(name)
        cp = p.get("containerPort")
        if cp is None or cp == 0:
            out.append(required(f"{pp}.containerPort"))
        else:
            for msg in is_valid_port_num(cp):
                out.append(invalid(f"{pp}.containerPort", cp, msg))
        hp = p.get("hostPort")
        if hp not in (None, 0):
            for msg in is_valid_port_num(hp):
                out.append(invalid(f"{pp}.hostPort", hp, msg))
        proto = p.get("protocol")
        if proto is None or proto == "":
            out.append(required(f"{pp}.protocol"))
        elif proto not in PROTOCOLS:
            out.append(not_supported(f"{pp}.protocol", proto, PROTOCOLS))


def validate_container(c: Any, path: str, volumes: set[str], *, init: bool = False) -> list[Cause]:
    """One container; container-name uniqueness is checked by the pod spec."""
    if not isinstance(c, dict):
        return [type_invalid(path, c, "object")]
    out: list[Cause] = []
    image = c.get("image")
    if not image or (isinstance(image, str) and not image.strip()):
        out.append(required(f"{path}.image"))
    elif not isinstance(image, str):
        out.append(type_invalid(f"{path}.image", image, "string"))
    for key in ("command", "args"):
        v = c.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            out.append(type_invalid(f"{path}.{key}", v, "array of strings"))
    _validate_ports(c.get("ports"), f"{path}.ports", out)
    _validate_env(c.get("env"), f"{path}.env", out)
    out.extend(validate_resources(c.get("resources"), f"{path}.resources"))
    pull = c.get("imagePullPolicy")
    if pull is not None and pull not in PULL_POLICIES:
        out.append(not_supported(f"{path}.imagePullPolicy", pull, PULL_POLICIES))
    tmp = c.get("terminationMessagePolicy")
    if tmp is not None and tmp not in TERMINATION_MESSAGE_POLICIES:
        out.append(not_supported(f"{path}.terminationMessagePolicy", tmp, TERMINATION_MESSAGE_POLICIES))
    mounts = c.get("volumeMounts")
    if mounts is not None:
        if not isinstance(mounts, list):
            out.append(type_invalid(f"{path}.volumeMounts", mounts, "array"))
        else:
            paths: set[str] = set()
            for i, m in enumerate(mounts):
                mp = f"{path}.volumeMounts[{i}]"
                if not isinstance(m, dict):
                    out.append(type_invalid(mp, m, "object"))
                    continue
                vname = m.get("name")
                if not vname:
                    out.append(required(f"{mp}.name"))
                elif vname not in volumes:
                    out.append(not_found(f"{mp}.name", vname))
                mpath = m.get("mountPath")
                if not mpath:
                    out.append(required(f"{mp}.mountPath"))
                elif isinstance(mpath, str):
                    if mpath in paths:
                        out.append(invalid(f"{mp}.mountPath", mpath, "must be unique"))
                    paths.add(mpath)
    if init:
        # Init containers (other than restartable sidecars) run to completion,
        # so Kubernetes forbids the probes that only make sense for long runners.
        sidecar = c.get("restartPolicy") == "Always"
        rp = c.get("restartPolicy")
        if rp is not None and rp != "Always":
            out.append(not_supported(f"{path}.restartPolicy", rp, ("Always",)))
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if c.get(probe) is not None and not sidecar:
                out.append(forbidden(f"{path}.{probe}", "may not be set for init containers"))
    for probe, strict in (("livenessProbe", True), ("readinessProbe", False), ("startupProbe", True)):
        out.extend(validate_probe(c.get(probe), f"{path}.{probe}", liveness_or_startup=strict))
    lifecycle = c.get("lifecycle")
    if isinstance(lifecycle, dict):
        for hook in ("postStart", "preStop"):
            h = lifecycle.get(hook)
            if h is not None:
                if isinstance(h, dict):
                    _validate_handler(h, f"{path}.lifecycle.{hook}", LIFECYCLE_HANDLERS, out)
                else:
                    out.append(type_invalid(f"{path}.lifecycle.{hook}", h, "object"))
    elif lifecycle is not None:
        out.append(type_invalid(f"{path}.lifecycle", lifecycle, "object"))
    return out


_VOLUME_SOURCES = ("emptyDir", "hostPath", "configMap", "secret", "persistentVolumeClaim",
                   "downwardAPI", "projected", "nfs", "csi", "ephemeral", "local", "image")


def _validate_volumes(volumes: Any, path: str, out: list[Cause]) -> set[str]:
    names: set[str] = set()
    if volumes is None:
        return names
    if not isinstance(volumes, list):
        out.append(type_invalid(path, volumes, "array"))
        return names
    for i, v in enumerate(volumes):
        vp = f"{path}[{i}]"
        if not isinstance(v, dict):
            out.append(type_invalid(vp, v, "object"))
            continue
        name = v.get("name")
        if not name:
            out.append(required(f"{vp}.name"))
        elif not isinstance(name, str):
            out.append(type_invalid(f"{vp}.name", name, "string"))
        else:
            for msg in is_dns1123_label(name):
                out.append(invalid(f"{vp}.name", name, msg))
            if name in names:
                out.append(duplicate(f"{vp}.name", name))
            names.add(name)
        sources = [k for k in _VOLUME_SOURCES if v.get(k) is not None]
        if len(sources) > 1:
            out.append(forbidden(f"{vp}.{sources[1]}", "may not specify more than 1 volume type"))
        hp = v.get("hostPath")
        if isinstance(hp, dict) and not hp.get("path"):
            out.append(required(f"{vp}.hostPath.path"))
        pvc = v.get("persistentVolumeClaim")
        if isinstance(pvc, dict) and not pvc.get("claimName"):
            out.append(required(f"{vp}.persistentVolumeClaim.claimName"))
    return names


def _go_toleration(t: dict[str, Any]) -> str:
    """A toleration as Go's %#v prints the internal `core.Toleration` struct.

    kube-apiserver puts the whole struct in the message when `operator: Exists`
    comes with a value; the pointer field prints as an address there, which is
    meaningless outside that process, so a fixed one stands in for it.
    """
    def q(key: str) -> str:
        val = t.get(key)
        return json.dumps(val if isinstance(val, str) else "")

    secs = "(*int64)(nil)" if t.get("tolerationSeconds") is None else "(*int64)(0xc000000000)"
    return (f"core.Toleration{{Key:{q('key')}, Operator:{q('operator')}, Value:{q('value')}, "
            f"Effect:{q('effect')}, TolerationSeconds:{secs}}}")


def validate_tolerations(tols: Any, path: str) -> list[Cause]:
    """ValidateTolerations (pkg/apis/core/validation), check for check and word for word."""
    if tols is None:
        return []
    if not isinstance(tols, list):
        return [type_invalid(path, tols, "array")]
    out: list[Cause] = []
    for i, t in enumerate(tols):
        tp = f"{path}[{i}]"
        if not isinstance(t, dict):
            out.append(type_invalid(tp, t, "object"))
            continue
        bad_type = False
        for f in ("key", "operator", "value", "effect"):
            if t.get(f) is not None and not isinstance(t[f], str):
                out.append(type_invalid(f"{tp}.{f}", t[f], "string"))
                bad_type = True
        secs = t.get("tolerationSeconds")
        if secs is not None and as_int(secs) is None:
            out.append(type_invalid(f"{tp}.tolerationSeconds", secs, "integer"))
            bad_type = True
        if bad_type:
            continue
        key = t.get("key") or ""
        op = t.get("operator") or ""
        value = t.get("value") or ""
        effect = t.get("effect") or ""
        if key:
            out.extend(validate_label_name(key, f"{tp}.key"))
        # An empty key with Exists (and no value) is the "tolerate everything" toleration.
        if not key and op != "Exists":
            out.append(invalid(f"{tp}.operator", op,
                               "operator must be Exists when `key` is empty, which means \"match all "
                               "values and all keys\""))
        if secs is not None and effect != "NoExecute":
            out.append(invalid(f"{tp}.effect", effect,
                               "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if op in ("Equal", ""):
            errs = is_valid_label_value(value)
            if errs:
                out.append(invalid(f"{tp}.operator", value, ";".join(errs)))
        elif op == "Exists":
            if value:
                out.append(cause(f"{tp}.operator", f"Invalid value: {_go_toleration(t)}: value must be "
                                 "empty when `operator` is 'Exists'", "FieldValueInvalid"))
        else:
            out.append(not_supported(f"{tp}.operator", op, ("Equal", "Exists")))
        if effect and effect not in TAINT_EFFECTS:
            out.append(not_supported(f"{tp}.effect", effect, TAINT_EFFECTS))
    return out


# ---------------------------------------------------------------------------
# Affinity and topology spread (pkg/apis/core/validation: validateAffinity,
# validateTopologySpreadConstraints).  The scheduler trusts these shapes, so a
# malformed term is refused here, with kube-apiserver's paths and words,
# instead of surfacing later as an unschedulable pod.
# ---------------------------------------------------------------------------

NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
SCHEDULE_ACTIONS = ("DoNotSchedule", "ScheduleAnyway")  # sets.List order
NODE_INCLUSION_POLICIES = ("Honor", "Ignore")
NOT_POSITIVE = "must be greater than zero"
WEIGHT_RANGE = "must be in the range 1-100"


def _objects(value: Any, path: str, out: list[Cause]) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) for the dict items of a list field; type problems go to `out`."""
    if value is None:
        return []
    if not isinstance(value, list):
        out.append(type_invalid(path, value, "array"))
        return []
    items = []
    for i, item in enumerate(value):
        if isinstance(item, dict):
            items.append((i, item))
        else:
            out.append(type_invalid(f"{path}[{i}]", item, "object"))
    return items


def _strings(value: Any, path: str, out: list[Cause]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        out.append(type_invalid(path, value, "array of strings"))
        return []
    return value


def _node_selector_requirement(rq: dict[str, Any], path: str, out: list[Cause]) -> None:
    values = _strings(rq.get("values"), f"{path}.values", out)
    op = rq.get("operator")
    if op in ("In", "NotIn"):
        if not values:
            out.append(required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist"):
        if values:
            out.append(forbidden(f"{path}.values",
                                 "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            out.append(required(f"{path}.values",
                                "must be specified single value when `operator` is 'Lt' or 'Gt'"))
    else:
        out.append(invalid(f"{path}.operator", op if op is not None else "", "not a valid selector operator"))
    out.extend(validate_label_name(rq.get("key"), f"{path}.key"))


def _node_field_selector_requirement(rq: dict[str, Any], path: str, out: list[Cause]) -> None:
    values = _strings(rq.get("values"), f"{path}.values", out)
    op = rq.get("operator")
    if op in ("In", "NotIn"):
        if len(values) != 1:
            out.append(required(f"{path}.values", "must be only one value when `operator` is 'In' or "
                                "'NotIn' for node field selector"))
    else:
        out.append(invalid(f"{path}.operator", op if op is not None else "", "not a valid selector operator"))
    key = rq.get("key")
    if key != "metadata.name":
        out.append(invalid(f"{path}.key", key if key is not None else "", "not a valid field selector key"))
    else:
        for j, val in enumerate(values):
            for msg in is_dns1123_subdomain(val):
                out.append(invalid(f"{path}.values[{j}]", val, msg))


def validate_node_selector_term(term: Any, path: str) -> list[Cause]:
    """ValidateNodeSelectorTerm: matchExpressions on labels, matchFields on metadata.name."""
    if not isinstance(term, dict):
        return [type_invalid(path, term, "object")]
    out: list[Cause] = []
    for j, rq in _objects(term.get("matchExpressions"), f"{path}.matchExpressions", out):
        _node_selector_requirement(rq, f"{path}.matchExpressions[{j}]", out)
    for j, rq in _objects(term.get("matchFields"), f"{path}.matchFields", out):
        _node_field_selector_requirement(rq, f"{path}.matchFields[{j}]", out)
    return out


def validate_node_selector(sel: Any, path: str) -> list[Cause]:
    """ValidateNodeSelector: at least one term; the terms are ORed."""
    if not isinstance(sel, dict):
        return [type_invalid(path, sel, "object")]
    out: list[Cause] = []
    tp = f"{path}.nodeSelectorTerms"
    terms = sel.get("nodeSelectorTerms")
    if not terms:
        return [required(tp, "must have at least one node selector term")]
    if not isinstance(terms, list):
        return [type_invalid(tp, terms, "array")]
    for i, term in enumerate(terms):
        out.extend(validate_node_selector_term(term, f"{tp}[{i}]"))
    return out


def _weight(item: dict[str, Any], path: str, out: list[Cause]) -> None:
    w = item.get("weight", 0)
    if as_int(w) is None:
        out.append(type_invalid(path, w, "int32"))
    elif not 1 <= w <= 100:
        out.append(invalid(path, w, WEIGHT_RANGE))


def _validate_node_affinity(na: Any, path: str, out: list[Cause]) -> None:
    if not isinstance(na, dict):
        out.append(type_invalid(path, na, "object"))
        return
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        out.extend(validate_node_selector(req, f"{path}.requiredDuringSchedulingIgnoredDuringExecution"))
    pp = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, term in _objects(na.get("preferredDuringSchedulingIgnoredDuringExecution"), pp, out):
        _weight(term, f"{pp}[{i}].weight", out)
        pref = term.get("preference")
        out.extend(validate_node_selector_term(pref if pref is not None else {}, f"{pp}[{i}].preference"))


def _label_keys(keys: list[str], sel: Any, path: str, out: list[Cause]) -> None:
    if not keys:
        return
    if sel is None:
        out.append(forbidden(path, "must not be specified when labelSelector is not set"))
        return
    for i, k in enumerate(keys):
        out.extend(validate_label_name(k, f"{path}[{i}]"))


def _pod_affinity_term(term: dict[str, Any], path: str, out: list[Cause]) -> None:
    """validatePodAffinityTerm: selectors, namespaces, match/mismatchLabelKeys, topologyKey."""
    sel = term.get("labelSelector")
    out.extend(validate_label_selector(sel, f"{path}.labelSelector"))
    out.extend(validate_label_selector(term.get("namespaceSelector"), f"{path}.namespaceSelector"))
    for ns in _strings(term.get("namespaces"), f"{path}.namespaces", out):
        for msg in is_dns1123_label(ns):
            # Sic: kube-apiserver names this path "namespace".
            out.append(invalid(f"{path}.namespace", ns, msg))
    match = _strings(term.get("matchLabelKeys"), f"{path}.matchLabelKeys", out)
    mismatch = _strings(term.get("mismatchLabelKeys"), f"{path}.mismatchLabelKeys", out)
    _label_keys(match, sel, f"{path}.matchLabelKeys", out)
    _label_keys(mismatch, sel, f"{path}.mismatchLabelKeys", out)
    for i, k in enumerate(match):
        if k in mismatch:
            out.append(invalid(f"{path}.matchLabelKeys[{i}]", k,
                               "exists in both matchLabelKeys and mismatchLabelKeys"))
    key = term.get("topologyKey")
    if not key:
        out.append(required(f"{path}.topologyKey", "can not be empty"))
    out.extend(validate_label_name(key, f"{path}.topologyKey"))


def _validate_pod_affinity(pa: Any, path: str, out: list[Cause]) -> None:
    if not isinstance(pa, dict):
        out.append(type_invalid(path, pa, "object"))
        return
    rp = f"{path}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, term in _objects(pa.get("requiredDuringSchedulingIgnoredDuringExecution"), rp, out):
        _pod_affinity_term(term, f"{rp}[{i}]", out)
    pp = f"{path}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, wt in _objects(pa.get("preferredDuringSchedulingIgnoredDuringExecution"), pp, out):
        _weight(wt, f"{pp}[{i}].weight", out)
        term = wt.get("podAffinityTerm")
        if term is not None and not isinstance(term, dict):
            out.append(type_invalid(f"{pp}[{i}].podAffinityTerm", term, "object"))
            continue
        _pod_affinity_term(term or {}, f"{pp}[{i}].podAffinityTerm", out)


def validate_affinity(aff: Any, path: str) -> list[Cause]:
    """validateAffinity: nodeAffinity, podAffinity, podAntiAffinity."""
    if aff is None:
        return []
    if not isinstance(aff, dict):
        return [type_invalid(path, aff, "object")]
    out: list[Cause] = []
    if aff.get("nodeAffinity") is not None:
        _validate_node_affinity(aff["nodeAffinity"], f"{path}.nodeAffinity", out)
    if aff.get("podAffinity") is not None:
        _validate_pod_affinity(aff["podAffinity"], f"{path}.podAffinity", out)
    if aff.get("podAntiAffinity") is not None:
        _validate_pod_affinity(aff["podAntiAffinity"], f"{path}.podAntiAffinity", out)
    return out


def validate_topology_spread_constraints(constraints: Any, path: str) -> list[Cause]:
    """validateTopologySpreadConstraints, in kube-apiserver's order of checks."""
    out: list[Cause] = []
    items = _objects(constraints, path, out)
    for pos, (i, c) in enumerate(items):
        cp = f"{path}[{i}]"
        skew = c.get("maxSkew", 0)
        if as_int(skew) is None:
            out.append(type_invalid(f"{cp}.maxSkew", skew, "int32"))
        elif skew <= 0:
            out.append(invalid(f"{cp}.maxSkew", skew, NOT_POSITIVE))
        key = c.get("topologyKey")
        if not key:
            out.append(required(f"{cp}.topologyKey", "can not be empty"))
        elif not isinstance(key, str):
            out.append(type_invalid(f"{cp}.topologyKey", key, "string"))
        action = c.get("whenUnsatisfiable")
        if action not in SCHEDULE_ACTIONS:
            out.append(not_supported(f"{cp}.whenUnsatisfiable", action if action is not None else "",
                                     SCHEDULE_ACTIONS))
        # {topologyKey, whenUnsatisfiable} names one kind of constraint: no repeats.
        for _j, later in items[pos + 1:]:
            if later.get("topologyKey") == key and later.get("whenUnsatisfiable") == action:
                out.append(duplicate(f"{cp}.{{topologyKey, whenUnsatisfiable}}",
                                     f"{{{key or ''}, {action or ''}}}"))
                break
        md = c.get("minDomains")
        if md is not None:
            if as_int(md) is None:
                out.append(type_invalid(f"{cp}.minDomains", md, "int32"))
            else:
                if md <= 0:
                    out.append(invalid(f"{cp}.minDomains", md, NOT_POSITIVE))
                if action != "DoNotSchedule":
                    out.append(invalid(f"{cp}.minDomains", md, "can only use minDomains if "
                                       f"whenUnsatisfiable=DoNotSchedule, not {action or ''}"))
        for policy in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            val = c.get(policy)
            if val is not None and val not in NODE_INCLUSION_POLICIES:
                out.append(not_supported(f"{cp}.{policy}", val, NODE_INCLUSION_POLICIES))
        sel = c.get("labelSelector")
        keys = _strings(c.get("matchLabelKeys"), f"{cp}.matchLabelKeys", out)
        if keys:
            sel_keys: set[str] = set()
            if isinstance(sel, dict):
                if isinstance(sel.get("matchLabels"), dict):
                    sel_keys.update(sel["matchLabels"])
                for e in sel.get("matchExpressions") or []:
                    if isinstance(e, dict) and isinstance(e.get("key"), str):
                        sel_keys.add(e["key"])
            else:
                out.append(forbidden(f"{cp}.matchLabelKeys",
                                     "must not be specified when labelSelector is not set"))
            for j, k in enumerate(keys):
                out.extend(validate_label_name(k, f"{cp}.matchLabelKeys[{j}]"))
                if k in sel_keys:
                    out.append(invalid(f"{cp}.matchLabelKeys[{j}]", k,
                                       "exists in both matchLabelKeys and labelSelector"))
        out.extend(validate_label_selector(sel, f"{cp}.labelSelector"))
    return out


def validate_pod_spec(spec: Any, path: str = "spec", *,
                      restart_policies: tuple[str, ...] = RESTART_POLICIES,
                      restart_policy_required_detail: str = "") -> list[Cause]:
    """A PodSpec (of a Pod, or of a template with `path` = `spec.template.spec`)."""
    if spec is None:
        return [required(path)]
    if not isinstance(spec, dict):
        return [type_invalid(path, spec, "object")]
    out: list[Cause] = []
    volumes = _validate_volumes(spec.get("volumes"), f"{path}.volumes", out)
    names: set[str] = set()
    for field_name, init in (("initContainers", True), ("containers", False)):
        cs = spec.get(field_name)
        fp = f"{path}.{field_name}"
        if cs is None or cs == []:
            if not init:
                out.append(required(fp))
            continue
        if not isinstance(cs, list):
            out.append(type_invalid(fp, cs, "array"))
            continue
        for i, c in enumerate(cs):
            cp = f"{fp}[{i}]"
            if isinstance(c, dict):
                name = c.get("name")
                if not name:
                    out.append(required(f"{cp}.name"))
                elif not isinstance(name, str):
                    out.append(type_invalid(f"{cp}.name", name, "string"))
                else:
                    for msg in is_dns1123_label(name):
                        out.append(invalid(f"{cp}.name", name, msg))
                    if name in names:
                        out.append(duplicate(f"{cp}.name", name))
                    names.add(name)
            out.extend(validate_container(c, cp, volumes, init=init))
    rp = spec.get("restartPolicy")
    if rp is None or rp == "":
        out.append(required(f"{path}.restartPolicy", restart_policy_required_detail))
    elif rp not in restart_policies:
        out.append(not_supported(f"{path}.restartPolicy", rp, restart_policies))
    dp = spec.get("dnsPolicy")
    if dp is not None and dp not in DNS_POLICIES:
        out.append(not_supported(f"{path}.dnsPolicy", dp, DNS_POLICIES))
    nonnegative(spec, "terminationGracePeriodSeconds", f"{path}.terminationGracePeriodSeconds", out)
    positive(spec, "activeDeadlineSeconds", f"{path}.activeDeadlineSeconds", out)
    ns = spec.get("nodeSelector")
    if ns is not None:
        out.extend(validate_labels(ns, f"{path}.nodeSelector"))
    for key in ("nodeName", "serviceAccountName", "hostname", "subdomain", "priorityClassName"):
        v = spec.get(key)
        if v in (None, ""):
            continue
        if not isinstance(v, str):
            out.append(type_invalid(f"{path}.{key}", v, "string"))
            continue
        check = is_dns1123_label if key in ("hostname", "subdomain") else is_dns1123_subdomain
        for msg in check(v):
            out.append(invalid(f"{path}.{key}", v, msg))
    out.extend(validate_affinity(spec.get("affinity"), f"{path}.affinity"))
    out.extend(validate_tolerations(spec.get("tolerations"), f"{path}.tolerations"))
    prio = spec.get("priority")
    if prio is not None and as_int(prio) is None:
        out.append(type_invalid(f"{path}.priority", prio, "int32"))
    out.extend(validate_preemption_policy(spec.get("preemptionPolicy"), f"{path}.preemptionPolicy"))
    out.extend(validate_topology_spread_constraints(spec.get("topologySpreadConstraints"),
                                                    f"{path}.topologySpreadConstraints"))
    return out


def validate_pod_template(template: Any, path: str, *, selector: dict[str, Any] | None,
                          restart_policies: tuple[str, ...] = RESTART_POLICIES,
                          restart_policy_required_detail: str = "") -> list[Cause]:
    """A PodTemplateSpec: its labels (which must satisfy `selector`) and its pod spec."""
    if template is None:
        return [required(path)]
    if not isinstance(template, dict):
        return [type_invalid(path, template, "object")]
    out: list[Cause] = []
    tmeta = template.get("metadata") or {}
    if not isinstance(tmeta, dict):
        out.append(type_invalid(f"{path}.metadata", tmeta, "object"))
        tmeta = {}
    labels = tmeta.get("labels") or {}
    out.extend(validate_labels(tmeta.get("labels"), f"{path}.metadata.labels"))
    out.extend(validate_annotations(tmeta.get("annotations"), f"{path}.metadata.annotations"))
    if selector is not None and isinstance(labels, dict) and not selector_is_empty(selector):
        try:
            parsed = parsed_label_selector(selector)
        except BadRequest:  # as Kubernetes: a selector that does not parse is reported on its own
            parsed = None
        if parsed is not None and not parsed.matches(labels):
            out.append(invalid(f"{path}.metadata.labels", labels,
                               "`selector` does not match template `labels`"))
    out.extend(validate_pod_spec(template.get("spec"), f"{path}.spec",
                                 restart_policies=restart_policies,
                                 restart_policy_required_detail=restart_policy_required_detail))
    spec = template.get("spec")
    if isinstance(spec, dict) and spec.get("ephemeralContainers"):
        # Added to running pods only (pods/ephemeralcontainers), never templated.
        out.append(forbidden(f"{path}.spec.ephemeralContainers",
                             "ephemeral containers not allowed in pod template"))
    return out
