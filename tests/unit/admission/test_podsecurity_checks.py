"""The Pod Security Standards' checks: each check's pass and fail cases, with Kubernetes' messages."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.admission import podsecurity_checks as psc
from fleet.admission.podsecurity_checks import LevelVersion, PolicyError, Violation


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), annotations: dict[str, str] | None = None,
        **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    s: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        s["initContainers"] = list(init)
    return {"name": "p", "annotations": annotations or {}}, s


def c(name: str = "c", **sc: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "busybox"}
    if sc:
        out["securityContext"] = sc
    return out


RESTRICTED_OK = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                 "seccompProfile": {"type": "RuntimeDefault"}}


CASES = [
    # (check function, (meta, spec), expected Violation or None)
    (psc.host_namespaces, pod(c()), None),
    (psc.host_namespaces, pod(c(), hostNetwork=True, hostIPC=True),
     Violation("host namespaces", "hostNetwork=true, hostIPC=true")),
    (psc.host_namespaces, pod(c(), hostPID=True), Violation("host namespaces", "hostPID=true")),
    (psc.privileged, pod(c(privileged=False)), None),
    (psc.privileged, pod(c("a", privileged=True)),
     Violation("privileged", 'container "a" must not set securityContext.privileged=true')),
    (psc.privileged, pod(c("a", privileged=True), init=(c("i", privileged=True),)),
     Violation("privileged", 'containers "i", "a" must not set securityContext.privileged=true')),
    (psc.capabilities_baseline, pod(c(capabilities={"add": ["CHOWN", "NET_BIND_SERVICE"]})), None),
    (psc.capabilities_baseline, pod(c(capabilities={"add": ["SYS_ADMIN", "NET_RAW", "CHOWN"]})),
     Violation("non-default capabilities",
               'container "c" must not include "NET_RAW", "SYS_ADMIN" in securityContext.capabilities.add')),
    (psc.host_path_volumes, pod(c(), volumes=[{"name": "e", "emptyDir": {}}]), None),
    (psc.host_path_volumes, pod(c(), volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
     Violation("hostPath volumes", 'volume "h"')),
    (psc.host_path_volumes, pod(c(), volumes=[{"name": "h", "hostPath": {"path": "/"}},
                                              {"name": "g", "hostPath": {"path": "/x"}}]),
     Violation("hostPath volumes", 'volumes "h", "g"')),
    (psc.host_ports, pod({"name": "c", "ports": [{"containerPort": 80}]}), None),
    (psc.host_ports, pod({"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}),
     Violation("hostPort", 'container "c" uses hostPort 8080')),
    (psc.host_ports, pod({"name": "a", "ports": [{"hostPort": 80}, {"hostPort": 443}]},
                         {"name": "b", "ports": [{"hostPort": 80}]}),
     Violation("hostPort", 'containers "a", "b" use hostPorts 443, 80')),
    (psc.app_armor_profile, pod(c(), annotations={
        "container.apparmor.security.beta.kubernetes.io/c": "runtime/default"}), None),
    (psc.app_armor_profile, pod(c(), annotations={
        "container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
     Violation("forbidden AppArmor profile", 'container.apparmor.security.beta.kubernetes.io/c="unconfined"')),
    # The appArmorProfile fields count as the annotations kube-apiserver derives from them.
    (psc.app_armor_profile, pod(c("a"), c("b", appArmorProfile={"type": "RuntimeDefault"}),
                                securityContext={"appArmorProfile": {"type": "Unconfined"}}),
     Violation("forbidden AppArmor profile", 'container.apparmor.security.beta.kubernetes.io/a="unconfined"')),
    (psc.app_armor_profile, pod(c(appArmorProfile={"type": "Localhost", "localhostProfile": "p"})), None),
    (psc.selinux_options, pod(c(seLinuxOptions={"type": "container_t", "level": "s0:c1"})), None),
    (psc.selinux_options, pod(c(seLinuxOptions={"type": "spc_t", "user": "u"}),
                              securityContext={"seLinuxOptions": {"role": "r", "type": "x_t"}}),
     Violation("seLinuxOptions", 'pod and container "c" set forbidden securityContext.seLinuxOptions: '
               'types "spc_t", "x_t"; user may not be set; role may not be set')),
    (psc.proc_mount, pod(c(procMount="Default")), None),
    (psc.proc_mount, pod(c(procMount="Unmasked")),
     Violation("procMount", 'container "c" must not set securityContext.procMount to "Unmasked"')),
    (psc.seccomp_baseline_annotations, pod(c(), annotations={
        "seccomp.security.alpha.kubernetes.io/pod": "unconfined"}),
     Violation("seccompProfile", 'forbidden annotation seccomp.security.alpha.kubernetes.io/pod="unconfined"')),
    (psc._seccomp(False), pod(c()), None),
    (psc._seccomp(False), pod(c(seccompProfile={"type": "Unconfined"})),
     Violation("seccompProfile", 'container "c" must not set securityContext.seccompProfile.type to "Unconfined"')),
    (psc._seccomp(True), pod(c(), securityContext={"seccompProfile": {"type": "RuntimeDefault"}}), None),
    (psc._seccomp(True), pod(c()),
     Violation("seccompProfile", 'pod or container "c" must set securityContext.seccompProfile.type to '
               '"RuntimeDefault" or "Localhost"')),
    (psc._seccomp(True), pod(c(seccompProfile={"type": "Unconfined"}),
                             securityContext={"seccompProfile": {"type": "Unconfined"}}),
     Violation("seccompProfile", 'pod and container "c" must not set securityContext.seccompProfile.type to '
               '"Unconfined"')),
    (psc._sysctls(psc.SYSCTLS_1_32), pod(c(), securityContext={"sysctls": [{"name": "net.ipv4.tcp_rmem"}]}), None),
    (psc._sysctls(psc.SYSCTLS_1_0), pod(c(), securityContext={
        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start"}]}), None),
    (psc._sysctls(psc.SYSCTLS_1_27), pod(c(), securityContext={"sysctls": [{"name": "net.ipv4.tcp_fin_timeout"}]}),
     Violation("forbidden sysctls", "net.ipv4.tcp_fin_timeout")),
    (psc._sysctls(psc.SYSCTLS_1_0), pod(c(), securityContext={"sysctls": [{"name": "net.ipv4.tcp_rmem"},
                                                                          {"name": "kernel.msgmax"}]}),
     Violation("forbidden sysctls", "net.ipv4.tcp_rmem, kernel.msgmax")),
    (psc.windows_host_process, pod(c(windowsOptions={"hostProcess": True}),
                                   securityContext={"windowsOptions": {"hostProcess": True}}),
     Violation("hostProcess", 'pod and container "c" must not set securityContext.windowsOptions.hostProcess=true')),
    (psc.allow_privilege_escalation, pod(c(allowPrivilegeEscalation=False)), None),
    (psc.allow_privilege_escalation, pod(c("a"), c("b", allowPrivilegeEscalation=True)),
     Violation("allowPrivilegeEscalation != false",
               'containers "a", "b" must set securityContext.allowPrivilegeEscalation=false')),
    (psc.capabilities_restricted, pod(c(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]})), None),
    (psc.capabilities_restricted, pod(c("a"), c("b", capabilities={"drop": ["ALL"], "add": ["SYS_TIME"]})),
     Violation("unrestricted capabilities", 'container "a" must set securityContext.capabilities.drop=["ALL"]; '
               'container "b" must not include "SYS_TIME" in securityContext.capabilities.add')),
    (psc.restricted_volumes, pod(c(), volumes=[{"name": "s", "secret": {"secretName": "x"}},
                                               {"name": "p", "persistentVolumeClaim": {"claimName": "x"}}]), None),
    (psc.restricted_volumes, pod(c(), volumes=[{"name": "h", "hostPath": {"path": "/"}},
                                               {"name": "n", "nfs": {"server": "s", "path": "/"}}]),
     Violation("restricted volume types", 'volumes "h", "n" use restricted volume types "hostPath", "nfs"')),
    (psc.restricted_volumes, pod(c(), volumes=[{"name": "w"}]),
     Violation("restricted volume types", 'volume "w" uses restricted volume type "unknown"')),
    (psc.run_as_non_root, pod(c(), securityContext={"runAsNonRoot": True}), None),
    (psc.run_as_non_root, pod(c()),
     Violation("runAsNonRoot != true", 'pod or container "c" must set securityContext.runAsNonRoot=true')),
    (psc.run_as_non_root, pod(c(runAsNonRoot=False), securityContext={"runAsNonRoot": False}),
     Violation("runAsNonRoot != true", 'pod and container "c" must not set securityContext.runAsNonRoot=false')),
    (psc.run_as_user, pod(c(runAsUser=1000)), None),
    (psc.run_as_user, pod(c(runAsUser=0), securityContext={"runAsUser": 0}),
     Violation("runAsUser=0", 'pod and container "c" must not set runAsUser=0')),
]


@pytest.mark.parametrize("check,pod_,expected", CASES)
def test_check(check: Any, pod_: tuple[dict[str, Any], dict[str, Any]], expected: Violation | None) -> None:
    assert check(*pod_) == expected


def test_privileged_level_checks_nothing() -> None:
    meta, spec = pod(c(privileged=True), hostNetwork=True)
    assert psc.evaluate(LevelVersion("privileged"), meta, spec) == []


def test_restricted_latest_message_of_a_bare_pod() -> None:
    meta, spec = pod(c())
    reason = psc.forbidden_reason(psc.evaluate(LevelVersion("restricted"), meta, spec))
    assert reason == (
        'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
        '"Localhost")')


def test_baseline_does_not_run_restricted_checks() -> None:
    meta, spec = pod(c())
    assert psc.evaluate(LevelVersion("baseline"), meta, spec) == []
    meta, spec = pod(c(**RESTRICTED_OK))
    assert psc.evaluate(LevelVersion("restricted"), meta, spec) == []


def test_restricted_overrides_the_baseline_checks_it_tightens() -> None:
    meta, spec = pod(c(**{**RESTRICTED_OK, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}),
                     volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    reasons = [v.reason for v in psc.evaluate(LevelVersion("restricted"), meta, spec)]
    # capabilities_restricted replaces capabilities_baseline, restrictedVolumes replaces hostPathVolumes.
    assert reasons == ["unrestricted capabilities", "restricted volume types"]
    reasons = [v.reason for v in psc.evaluate(LevelVersion("baseline"), meta, spec)]
    assert reasons == ["non-default capabilities", "hostPath volumes"]


def test_versions_pick_the_checks_of_their_time() -> None:
    meta, spec = pod(c(**{**RESTRICTED_OK, "runAsUser": 0}),
                     securityContext={"sysctls": [{"name": "net.ipv4.ip_local_reserved_ports"}]})
    assert [v.reason for v in psc.evaluate(LevelVersion("restricted", 22), meta, spec)] == ["forbidden sysctls"]
    assert [v.reason for v in psc.evaluate(LevelVersion("restricted", 27), meta, spec)] == ["runAsUser=0"]
    # Before 1.22 there is no capabilities_restricted; before 1.8 no allowPrivilegeEscalation.
    bare_meta, bare = pod(c(**{"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}))
    assert [v.reason for v in psc.evaluate(LevelVersion("restricted", 21), bare_meta, bare)] == [
        "allowPrivilegeEscalation != false"]
    assert psc.evaluate(LevelVersion("restricted", 7), bare_meta, bare) == []
    # Before 1.19 the seccomp check reads the alpha annotations, not the field.
    u_meta, u = pod(c(seccompProfile={"type": "Unconfined"}))
    assert psc.evaluate(LevelVersion("baseline", 18), u_meta, u) == []
    assert [v.reason for v in psc.evaluate(LevelVersion("baseline", 19), u_meta, u)] == ["seccompProfile"]
    # A version newer than this implementation's newest runs the newest checks.
    assert psc.evaluate(LevelVersion("restricted", 99), meta, spec) == psc.evaluate(
        LevelVersion("restricted"), meta, spec)


def test_selinux_container_engine_t_from_1_31() -> None:
    meta, spec = pod(c(seLinuxOptions={"type": "container_engine_t"}))
    assert psc.evaluate(LevelVersion("baseline", 31), meta, spec) == []
    assert psc.evaluate(LevelVersion("baseline", 30), meta, spec) == [Violation(
        "seLinuxOptions", 'container "c" set forbidden securityContext.seLinuxOptions: type "container_engine_t"')]


def test_windows_pods_skip_linux_only_restricted_checks_from_1_25() -> None:
    meta, spec = pod(c(runAsNonRoot=True), os={"name": "windows"})
    assert psc.evaluate(LevelVersion("restricted", 25), meta, spec) == []
    assert [v.reason for v in psc.evaluate(LevelVersion("restricted", 24), meta, spec)] == [
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "seccompProfile"]


@pytest.mark.parametrize("value,expected", [("latest", None), ("v1.0", 0), ("v1.32", 32), ("v1.40", 40)])
def test_parse_version(value: str, expected: int | None) -> None:
    assert psc.parse_version(value) == expected


@pytest.mark.parametrize("value", ["", "1.25", "v1.025", "v2.0", "v1.x", "Latest"])
def test_parse_version_refuses(value: str) -> None:
    with pytest.raises(PolicyError, match='must be "latest" or "v1.x"'):
        psc.parse_version(value)


def test_parse_level() -> None:
    assert psc.parse_level("baseline") == "baseline"
    with pytest.raises(PolicyError, match="must be one of privileged, baseline, restricted"):
        psc.parse_level("strict")


def test_level_version_string() -> None:
    assert str(LevelVersion("restricted")) == "restricted:latest"
    assert str(LevelVersion("baseline", 28)) == "baseline:v1.28"


def test_tolerates_wrong_shapes() -> None:
    meta, spec = {"annotations": None}, {"containers": [None, {"name": "c", "securityContext": "x"}],
                                         "volumes": "v", "securityContext": []}
    assert [v.reason for v in psc.evaluate(LevelVersion("restricted"), meta, spec)][0] == \
        "allowPrivilegeEscalation != false"


# ------------------------------------------------------------------ properties

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_bools = st.one_of(st.none(), st.booleans())
_container_sc = st.fixed_dictionaries({}, optional={
    "privileged": _bools, "allowPrivilegeEscalation": _bools, "runAsNonRoot": _bools,
    "runAsUser": st.one_of(st.none(), st.integers(0, 2)),
    "procMount": st.sampled_from(["Default", "Unmasked"]),
    "capabilities": st.fixed_dictionaries({}, optional={
        "add": st.lists(st.sampled_from(["NET_BIND_SERVICE", "CHOWN", "SYS_ADMIN", "NET_RAW"]), max_size=2),
        "drop": st.lists(st.sampled_from(["ALL", "NET_RAW"]), max_size=2)}),
    "seccompProfile": st.fixed_dictionaries({"type": st.sampled_from(["RuntimeDefault", "Localhost", "Unconfined"])}),
    "seLinuxOptions": st.fixed_dictionaries({}, optional={"type": st.sampled_from(["container_t", "spc_t"]),
                                                          "user": st.sampled_from(["", "u"])}),
    "windowsOptions": st.fixed_dictionaries({"hostProcess": st.booleans()}),
})
_containers = st.lists(st.builds(lambda i, sc, hp: {"name": f"c{i}", "image": "x", "securityContext": sc,
                                                     "ports": [{"containerPort": 80, "hostPort": hp}]},
                                 st.integers(0, 3), _container_sc, st.sampled_from([0, 8080])),
                       min_size=1, max_size=3)
_specs = st.builds(
    lambda cs, init, extra: {"containers": cs, "initContainers": init, **extra}, _containers,
    st.lists(st.builds(lambda sc: {"name": "init", "securityContext": sc}, _container_sc), max_size=1),
    st.fixed_dictionaries({}, optional={
        "hostNetwork": st.booleans(), "hostPID": st.booleans(), "os": st.just({"name": "windows"}),
        "securityContext": st.fixed_dictionaries({}, optional={
            "runAsNonRoot": st.booleans(), "runAsUser": st.integers(0, 1),
            "seccompProfile": st.fixed_dictionaries({"type": st.sampled_from(["RuntimeDefault", "Unconfined"])}),
            "sysctls": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["kernel.msgmax",
                                                                                "net.ipv4.tcp_rmem"])}),
                                max_size=2)}),
        "volumes": st.lists(st.sampled_from([{"name": "h", "hostPath": {"path": "/"}}, {"name": "e", "emptyDir": {}},
                                             {"name": "n", "nfs": {"server": "s", "path": "/"}}]), max_size=2)}))


@settings(max_examples=300, deadline=None)
@given(_specs, st.sampled_from([None, 0, 8, 19, 22, 25, 31, 32]))
def test_levels_are_nested(spec: dict[str, Any], minor: int | None) -> None:
    """What restricted allows, baseline allows; privileged allows everything; and a pod's
    baseline violations are never reported by restricted under other reasons than the
    restricted checks that override them."""
    meta: dict[str, Any] = {"name": "p"}
    restricted = psc.evaluate(LevelVersion("restricted", minor), meta, spec)
    baseline = psc.evaluate(LevelVersion("baseline", minor), meta, spec)
    assert psc.evaluate(LevelVersion("privileged", minor), meta, spec) == []
    if spec.get("os"):
        # Windows pods skip the linux-only restricted checks from v1.25, overrides included:
        # Kubernetes' pod validation forbids those fields on them, so nesting is only
        # promised for the pods validation admits.
        return
    if not restricted:
        assert baseline == []
    overridden_by = {"non-default capabilities": "unrestricted capabilities",
                     "hostPath volumes": "restricted volume types", "seccompProfile": "seccompProfile"}
    r_reasons = {v.reason for v in restricted}
    for v in baseline:
        assert v in restricted or overridden_by.get(v.reason) in r_reasons, (v, restricted)
