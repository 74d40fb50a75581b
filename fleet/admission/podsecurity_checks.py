"""The Pod Security Standards' checks (k8s.io/pod-security-admission `policy/`), as pure functions.

Each check looks at a pod's metadata and spec (plain JSON dicts) and answers
`None` (allowed) or a `Violation(reason, detail)` whose words are exactly
Kubernetes': the admission plugin (podsecurity.py) joins them into
`violates PodSecurity "restricted:latest": reason (detail), ...` and kubectl
users read the same text on Fleet as on a kube-apiserver.

Levels and versions work as in Kubernetes' registry: a level is
privileged (nothing checked), baseline (the baseline checks) or restricted
(baseline plus the restricted ones, minus the baseline checks a restricted one
overrides: capabilities, seccomp, hostPath volumes).  Each check has
implementations by minimum policy version; a `v1.X` policy runs, per check,
the newest implementation whose minimum version is <= 1.X, and `latest` the
newest of all (Kubernetes 1.32's set).  Violations are reported baseline
checks first, then restricted ones, each group in the order of the check IDs,
as Kubernetes' registry orders them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)
_LEVEL_RANK = {lvl: i for i, lvl in enumerate(LEVELS)}

# The newest policy version this implementation knows (Kubernetes 1.32's checks).
LATEST_MINOR = 32

_VERSION_RE = re.compile(r"^v1\.(0|[1-9][0-9]*)$")


class PolicyError(ValueError):
    """A level or version label value Kubernetes would refuse (the message is Kubernetes')."""


@dataclass(frozen=True)
class LevelVersion:
    """A level at a version; `minor` None is `latest`."""

    level: str
    minor: int | None = None

    def __str__(self) -> str:
        return f"{self.level}:{'latest' if self.minor is None else f'v1.{self.minor}'}"

    @property
    def effective_minor(self) -> int:
        return LATEST_MINOR if self.minor is None else self.minor


def parse_level(value: str) -> str:
    if value not in LEVELS:
        raise PolicyError("must be one of privileged, baseline, restricted")
    return value


def parse_version(value: str) -> int | None:
    """`latest` → None, `v1.X` → X."""
    if value == "latest":
        return None
    m = _VERSION_RE.match(value)
    if m is None:
        raise PolicyError('must be "latest" or "v1.x"')
    return int(m.group(1))


def compare_levels(a: str, b: str) -> int:
    return _LEVEL_RANK[a] - _LEVEL_RANK[b]


@dataclass(frozen=True)
class Violation:
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


CheckFn = Callable[[dict[str, Any], dict[str, Any]], "Violation | None"]


@dataclass(frozen=True)
class VersionedCheck:
    minimum_minor: int
    fn: CheckFn
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    id: str
    level: str
    versions: tuple[VersionedCheck, ...]

    def at(self, minor: int) -> VersionedCheck | None:
        best = None
        for v in self.versions:
            if v.minimum_minor <= minor:
                best = v
        return best


# ------------------------------------------------------------------ helpers (Kubernetes' words)

def join_quote(items: list[str]) -> str:
    return '"' + '", "'.join(items) + '"' if items else ""


def pluralize(singular: str, plural: str, n: int) -> str:
    return singular if n == 1 else plural


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Init containers, containers, then ephemeral containers (Kubernetes' visitContainers)."""
    for k in ("initContainers", "containers", "ephemeralContainers"):
        for c in _l(spec.get(k)):
            if isinstance(c, dict):
                yield c


def _name(c: dict[str, Any]) -> str:
    return str(c.get("name", ""))


def _csc(c: dict[str, Any]) -> dict[str, Any] | None:
    sc = c.get("securityContext")
    return sc if isinstance(sc, dict) else None


def _psc(spec: dict[str, Any]) -> dict[str, Any] | None:
    sc = spec.get("securityContext")
    return sc if isinstance(sc, dict) else None


def _containers_phrase(names: list[str]) -> str:
    return f"{pluralize('container', 'containers', len(names))} {join_quote(names)}"


def _windows(spec: dict[str, Any]) -> bool:
    return _d(spec.get("os")).get("name") == "windows"


# ------------------------------------------------------------------ baseline checks

def host_namespaces(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f) is True]
    return Violation("host namespaces", ", ".join(bad)) if bad else None


def privileged(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad = [_name(c) for c in containers(spec) if _d(_csc(c)).get("privileged") is True]
    if bad:
        return Violation("privileged", f"{_containers_phrase(bad)} must not set securityContext.privileged=true")
    return None


ALLOWED_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                  "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})


def capabilities_baseline(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad: list[str] = []
    caps: set[str] = set()
    for c in containers(spec):
        added = [str(a) for a in _l(_d(_d(_csc(c)).get("capabilities")).get("add"))]
        extra = [a for a in added if a not in ALLOWED_CAPABILITIES]
        if extra:
            bad.append(_name(c))
            caps.update(extra)
    if bad:
        return Violation("non-default capabilities", f"{_containers_phrase(bad)} must not include "
                         f"{join_quote(sorted(caps))} in securityContext.capabilities.add")
    return None


def host_path_volumes(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad = [str(v.get("name", "")) for v in _l(spec.get("volumes")) if isinstance(v, dict) and "hostPath" in v
           and v["hostPath"] is not None]
    if bad:
        return Violation("hostPath volumes", f"{pluralize('volume', 'volumes', len(bad))} {join_quote(bad)}")
    return None


def host_ports(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad: list[str] = []
    ports: set[str] = set()
    for c in containers(spec):
        hp = [p.get("hostPort") for p in _l(c.get("ports")) if isinstance(p, dict) and p.get("hostPort")]
        if hp:
            bad.append(_name(c))
            ports.update(str(p) for p in hp)
    if bad:
        # Kubernetes sorts the ports as strings (sets.String.List()).
        return Violation("hostPort", f"{_containers_phrase(bad)} {pluralize('uses', 'use', len(bad))} "
                         f"{pluralize('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}")
    return None


APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


def _apparmor_annotations(meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The beta annotations with the `appArmorProfile` fields folded in where a container has
    none: kube-apiserver writes them onto every pod it stores (its AppArmor version skew
    handling) before PodSecurity looks, Fleet does not, so the check derives them."""
    ann = dict(_d(meta.get("annotations")))
    pod_profile = _d(_psc(spec)).get("appArmorProfile")
    for c in containers(spec):
        key = APPARMOR_ANNOTATION_PREFIX + _name(c)
        profile = _d(_csc(c)).get("appArmorProfile") or pod_profile
        if key in ann or not isinstance(profile, dict):
            continue
        t = profile.get("type")
        if t == "RuntimeDefault":
            ann[key] = "runtime/default"
        elif t == "Unconfined":
            ann[key] = "unconfined"
        elif t == "Localhost":
            ann[key] = "localhost/" + str(profile.get("localhostProfile") or "")
    return ann


def app_armor_profile(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad = []
    for k, v in _apparmor_annotations(meta, spec).items():
        if k.startswith(APPARMOR_ANNOTATION_PREFIX) and not (
                v in ("", "runtime/default") or str(v).startswith("localhost/")):
            bad.append(f'{k}="{v}"')
    if bad:
        bad.sort()
        return Violation(pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", len(bad)),
                         ", ".join(bad))
    return None


SELINUX_TYPES_1_0 = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SELINUX_TYPES_1_31 = SELINUX_TYPES_1_0 | {"container_engine_t"}


def _selinux(allowed: frozenset[str]) -> CheckFn:
    def check(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
        return selinux_options(meta, spec, allowed)

    return check


def selinux_options(meta: dict[str, Any], spec: dict[str, Any],
                    allowed_types: frozenset[str] = SELINUX_TYPES_1_31) -> Violation | None:
    bad_types: set[str] = set()
    flags = {"user": False, "role": False}

    def valid(opts: dict[str, Any]) -> bool:
        ok = True
        t = str(opts.get("type") or "")
        if t not in allowed_types:
            ok = False
            bad_types.add(t)
        for f in ("user", "role"):
            if opts.get(f):
                ok = False
                flags[f] = True
        return ok

    setters: list[str] = []
    psel = _d(_psc(spec)).get("seLinuxOptions")
    if isinstance(psel, dict) and not valid(psel):
        setters.append("pod")
    bad = []
    for c in containers(spec):
        sel = _d(_csc(c)).get("seLinuxOptions")
        if isinstance(sel, dict) and not valid(sel):
            bad.append(_name(c))
    if bad:
        setters.append(_containers_phrase(bad))
    if not setters:
        return None
    data = []
    # As Kubernetes: user/role are only spelled out beside a bad type.
    if bad_types:
        data.append(f"{pluralize('type', 'types', len(bad_types))} {join_quote(sorted(bad_types))}")
        if flags["user"]:
            data.append("user may not be set")
        if flags["role"]:
            data.append("role may not be set")
    return Violation("seLinuxOptions", f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: "
                     f"{'; '.join(data)}")


def proc_mount(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad: list[str] = []
    kinds: set[str] = set()
    for c in containers(spec):
        pm = _d(_csc(c)).get("procMount")
        if pm is not None and pm != "Default":
            bad.append(_name(c))
            kinds.add(str(pm))
    if bad:
        return Violation("procMount", f"{_containers_phrase(bad)} must not set securityContext.procMount to "
                         f"{join_quote(sorted(kinds))}")
    return None


SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION_PREFIX = "container.seccomp.security.alpha.kubernetes.io/"
_VALID_SECCOMP = ("RuntimeDefault", "Localhost")


def seccomp_baseline_annotations(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    """v1.0-v1.18: the alpha annotations."""
    ann = _d(meta.get("annotations"))

    def ok(v: Any) -> bool:
        return v in ("runtime/default", "docker/default") or str(v).startswith("localhost/")

    bad: set[str] = set()
    if SECCOMP_POD_ANNOTATION in ann and not ok(ann[SECCOMP_POD_ANNOTATION]):
        bad.add(f'{SECCOMP_POD_ANNOTATION}="{ann[SECCOMP_POD_ANNOTATION]}"')
    for c in containers(spec):
        k = SECCOMP_CONTAINER_ANNOTATION_PREFIX + _name(c)
        if k in ann and not ok(ann[k]):
            bad.add(f'{k}="{ann[k]}"')
    if bad:
        return Violation("seccompProfile", f"forbidden {pluralize('annotation', 'annotations', len(bad))} "
                         f"{', '.join(sorted(bad))}")
    return None


def _seccomp(require: bool) -> CheckFn:
    """v1.19+ seccompProfile: explicit bad types always fail; with `require` (restricted)
    a container with no valid profile of its own or from the pod fails too."""

    def check(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
        setters: list[str] = []
        bad_values: set[str] = set()
        pod_set = False
        prof = _d(_psc(spec)).get("seccompProfile")
        if isinstance(prof, dict):
            if prof.get("type") not in _VALID_SECCOMP:
                setters.append("pod")
                bad_values.add(str(prof.get("type") or ""))
            else:
                pod_set = True
        explicit: list[str] = []
        implicit: list[str] = []
        for c in containers(spec):
            cp = _d(_csc(c)).get("seccompProfile")
            if isinstance(cp, dict):
                if cp.get("type") not in _VALID_SECCOMP:
                    explicit.append(_name(c))
                    bad_values.add(str(cp.get("type") or ""))
            elif not pod_set:
                implicit.append(_name(c))
        if explicit:
            setters.append(_containers_phrase(explicit))
        if setters:
            return Violation("seccompProfile", f"{' and '.join(setters)} must not set "
                             f"securityContext.seccompProfile.type to {join_quote(sorted(bad_values))}")
        if require and implicit:
            return Violation("seccompProfile", f"pod or {_containers_phrase(implicit)} must set "
                             'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"')
        return None

    return check


def _unless_windows(fn: CheckFn) -> CheckFn:
    """From v1.25 some restricted checks skip pods with spec.os.name=windows."""

    def check(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
        return None if _windows(spec) else fn(meta, spec)

    return check


SYSCTLS_1_0 = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                         "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"})
SYSCTLS_1_27 = SYSCTLS_1_0 | {"net.ipv4.ip_local_reserved_ports"}
SYSCTLS_1_29 = SYSCTLS_1_27 | {"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                               "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SYSCTLS_1_32 = SYSCTLS_1_29 | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}


def _sysctls(allowed: frozenset[str]) -> CheckFn:
    def check(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
        bad = [str(s.get("name")) for s in _l(_d(_psc(spec)).get("sysctls"))
               if isinstance(s, dict) and s.get("name") not in allowed]
        return Violation("forbidden sysctls", ", ".join(bad)) if bad else None

    return check


def windows_host_process(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    setters = []
    if _d(_d(_psc(spec)).get("windowsOptions")).get("hostProcess") is True:
        setters.append("pod")
    bad = [_name(c) for c in containers(spec) if _d(_d(_csc(c)).get("windowsOptions")).get("hostProcess") is True]
    if bad:
        setters.append(_containers_phrase(bad))
    if setters:
        return Violation("hostProcess", f"{' and '.join(setters)} must not set "
                         "securityContext.windowsOptions.hostProcess=true")
    return None


# ------------------------------------------------------------------ restricted checks

def allow_privilege_escalation(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad = [_name(c) for c in containers(spec) if _d(_csc(c)).get("allowPrivilegeEscalation") is not False]
    if bad:
        return Violation("allowPrivilegeEscalation != false",
                         f"{_containers_phrase(bad)} must set securityContext.allowPrivilegeEscalation=false")
    return None


def capabilities_restricted(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    missing_drop: list[str] = []
    adding: list[str] = []
    caps: set[str] = set()
    for c in containers(spec):
        capsec = _d(_csc(c)).get("capabilities")
        if not isinstance(capsec, dict):
            missing_drop.append(_name(c))
            continue
        if "ALL" not in _l(capsec.get("drop")):
            missing_drop.append(_name(c))
        extra = [str(a) for a in _l(capsec.get("add")) if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(_name(c))
            caps.update(extra)
    details = []
    if missing_drop:
        details.append(f'{_containers_phrase(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(f"{_containers_phrase(adding)} must not include {join_quote(sorted(caps))} in "
                       "securityContext.capabilities.add")
    return Violation("unrestricted capabilities", "; ".join(details)) if details else None


# Volume sources the restricted level allows; any other is reported by its field name.
_ALLOWED_VOLUME_SOURCES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                           "persistentVolumeClaim", "projected", "secret")
_RESTRICTED_VOLUME_SOURCES = ("hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi",
                              "glusterfs", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "fc", "azureFile",
                              "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "portworxVolume",
                              "scaleIO", "storageos")


def restricted_volumes(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    bad: list[str] = []
    kinds: set[str] = set()
    for v in _l(spec.get("volumes")):
        if not isinstance(v, dict):
            continue
        if any(v.get(k) is not None for k in _ALLOWED_VOLUME_SOURCES):
            continue
        bad.append(str(v.get("name", "")))
        kinds.add(next((k for k in _RESTRICTED_VOLUME_SOURCES if v.get(k) is not None), "unknown"))
    if bad:
        return Violation("restricted volume types",
                         f"{pluralize('volume', 'volumes', len(bad))} {join_quote(bad)} "
                         f"{pluralize('uses', 'use', len(bad))} "
                         f"{pluralize('restricted volume type', 'restricted volume types', len(kinds))} "
                         f"{join_quote(sorted(kinds))}")
    return None


def run_as_non_root(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    setters: list[str] = []
    pod_true = False
    prnr = _d(_psc(spec)).get("runAsNonRoot")
    if prnr is not None:
        if prnr is False:
            setters.append("pod")
        else:
            pod_true = True
    explicit: list[str] = []
    implicit: list[str] = []
    for c in containers(spec):
        v = _d(_csc(c)).get("runAsNonRoot")
        if v is not None:
            if v is False:
                explicit.append(_name(c))
        elif not pod_true:
            implicit.append(_name(c))
    if explicit:
        setters.append(_containers_phrase(explicit))
    if setters:
        return Violation("runAsNonRoot != true",
                         f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false")
    if implicit:
        return Violation("runAsNonRoot != true",
                         f"pod or {_containers_phrase(implicit)} must set securityContext.runAsNonRoot=true")
    return None


def _is_zero(v: Any) -> bool:
    return type(v) is int and v == 0


def run_as_user(meta: dict[str, Any], spec: dict[str, Any]) -> Violation | None:
    setters = []
    if _is_zero(_d(_psc(spec)).get("runAsUser")):
        setters.append("pod")
    bad = [_name(c) for c in containers(spec) if _is_zero(_d(_csc(c)).get("runAsUser"))]
    if bad:
        setters.append(_containers_phrase(bad))
    if setters:
        return Violation("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0")
    return None


# ------------------------------------------------------------------ the registry

CHECKS: tuple[Check, ...] = tuple(sorted((
    Check("allowPrivilegeEscalation", RESTRICTED, (
        VersionedCheck(8, allow_privilege_escalation),
        VersionedCheck(25, _unless_windows(allow_privilege_escalation)))),
    Check("appArmorProfile", BASELINE, (VersionedCheck(0, app_armor_profile),)),
    Check("capabilities_baseline", BASELINE, (VersionedCheck(0, capabilities_baseline),)),
    Check("capabilities_restricted", RESTRICTED, (
        VersionedCheck(22, capabilities_restricted, ("capabilities_baseline",)),
        VersionedCheck(25, _unless_windows(capabilities_restricted), ("capabilities_baseline",)))),
    Check("hostNamespaces", BASELINE, (VersionedCheck(0, host_namespaces),)),
    Check("hostPathVolumes", BASELINE, (VersionedCheck(0, host_path_volumes),)),
    Check("hostPorts", BASELINE, (VersionedCheck(0, host_ports),)),
    Check("privileged", BASELINE, (VersionedCheck(0, privileged),)),
    Check("procMount", BASELINE, (VersionedCheck(0, proc_mount),)),
    Check("restrictedVolumes", RESTRICTED, (VersionedCheck(0, restricted_volumes, ("hostPathVolumes",)),)),
    Check("runAsNonRoot", RESTRICTED, (VersionedCheck(0, run_as_non_root),)),
    Check("runAsUser", RESTRICTED, (VersionedCheck(23, run_as_user),)),
    Check("seLinuxOptions", BASELINE, (VersionedCheck(0, _selinux(SELINUX_TYPES_1_0)),
                                       VersionedCheck(31, _selinux(SELINUX_TYPES_1_31)))),
    Check("seccompProfile_baseline", BASELINE, (
        VersionedCheck(0, seccomp_baseline_annotations), VersionedCheck(19, _seccomp(False)))),
    Check("seccompProfile_restricted", RESTRICTED, (
        VersionedCheck(19, _seccomp(True), ("seccompProfile_baseline",)),
        VersionedCheck(25, _unless_windows(_seccomp(True)), ("seccompProfile_baseline",)))),
    Check("sysctls", BASELINE, (VersionedCheck(0, _sysctls(SYSCTLS_1_0)), VersionedCheck(27, _sysctls(SYSCTLS_1_27)),
                                VersionedCheck(29, _sysctls(SYSCTLS_1_29)), VersionedCheck(32, _sysctls(SYSCTLS_1_32)))),
    Check("windowsHostProcess", BASELINE, (VersionedCheck(0, windows_host_process),)),
), key=lambda c: c.id))


def checks_for(lv: LevelVersion) -> list[tuple[str, CheckFn]]:
    """The (id, function) pairs a level at a version runs, in ID order."""
    if lv.level == PRIVILEGED:
        return []
    minor = lv.effective_minor
    chosen: list[tuple[str, VersionedCheck]] = []
    for c in CHECKS:
        if lv.level == BASELINE and c.level != BASELINE:
            continue
        v = c.at(minor)
        if v is not None:
            chosen.append((c.id, v))
    overridden = {o for _, v in chosen for o in v.overrides}
    # Baseline checks first, then restricted ones, each in ID order (Kubernetes' registry).
    kept = [(cid, v) for cid, v in chosen if cid not in overridden]
    level_of = {c.id: c.level for c in CHECKS}
    kept.sort(key=lambda cv: (level_of[cv[0]] != BASELINE, cv[0]))
    return [(cid, v.fn) for cid, v in kept]


def evaluate(lv: LevelVersion, meta: dict[str, Any], spec: dict[str, Any]) -> list[Violation]:
    """Every violation of `lv` by a pod (metadata, spec); [] when allowed."""
    meta, spec = _d(meta), _d(spec)
    out = []
    for _cid, fn in checks_for(lv):
        v = fn(meta, spec)
        if v is not None:
            out.append(v)
    return out


def forbidden_reason(violations: list[Violation]) -> str:
    """Kubernetes' AggregateCheckResult.ForbiddenReason: `reason (detail), ...`."""
    return ", ".join(str(v) for v in violations)
