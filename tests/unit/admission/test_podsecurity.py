"""PodSecurity admission: namespace policies from labels, the decision per pod and template,
configuration, exemptions, audit annotations and warnings — the plugin alone over a small
fake store, then through the in-process API (403s, Warning headers, 422 on bad labels)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.admission import collect_warnings
from fleet.admission.podsecurity import (
    ANNOTATION_AUDIT_VIOLATIONS,
    ANNOTATION_ENFORCE_POLICY,
    ANNOTATION_EXEMPT,
    Config,
    ConfigError,
    Exemptions,
    PodSecurity,
    Policy,
    decide,
    existing_pod_warnings,
    parse_config,
    policy_from_labels,
    significant_pod_update,
)
from fleet.admission.podsecurity_checks import LevelVersion
from fleet.api import errors
from fleet.auth import ADMIN, Attributes, UserInfo
from fleet.auth.audit import CURRENT, DEFAULT_POLICY, RequestAudit
from fleet.store import KeyNotFound
from fleet.testing.apiserver import open_api

P = "pod-security.kubernetes.io/"
R, B, PRIV = LevelVersion("restricted"), LevelVersion("baseline"), LevelVersion("privileged")

BARE_RESTRICTED = (
    'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), '
    'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), '
    'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
    'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
    '"Localhost")')


def pod_obj(name: str = "p", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def good_pod(name: str = "good") -> dict[str, Any]:
    p = pod_obj(name)
    p["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    p["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}
    return p


def privileged_pod(name: str = "priv") -> dict[str, Any]:
    p = pod_obj(name, hostNetwork=True)
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return p


# ------------------------------------------------------------------ policy from labels

@pytest.mark.parametrize("labels,defaults,expected", [
    ({}, Policy(), Policy()),
    (None, Policy(B, B, R), Policy(B, B, R)),
    ({P + "enforce": "restricted"}, Policy(), Policy(enforce=R)),  # warn is not raised with it
    ({P + "enforce": "baseline", P + "warn": "privileged"}, Policy(warn=R), Policy(B, PRIV, PRIV)),
    ({P + "enforce": "baseline", P + "enforce-version": "v1.24"}, Policy(),
     Policy(enforce=LevelVersion("baseline", 24))),
    ({P + "audit": "restricted", P + "warn-version": "v1.30"}, Policy(warn=B),
     Policy(PRIV, R, LevelVersion("baseline", 30))),
    # A level label alone keeps the default's version.
    ({P + "warn": "restricted"}, Policy(warn=LevelVersion("baseline", 28)),
     Policy(warn=LevelVersion("restricted", 28))),
])
def test_policy_from_labels(labels: Any, defaults: Policy, expected: Policy) -> None:
    assert policy_from_labels(labels, defaults) == (expected, [])


def test_policy_from_labels_reports_every_bad_label() -> None:
    policy, causes = policy_from_labels({P + "enforce": "strict", P + "warn-version": "1.30", P + "warn": "x"},
                                        Policy(warn=LevelVersion("baseline", 20)))
    # Fail closed for enforce, open for warn; a bad version is latest.
    assert policy == Policy(enforce=R, warn=PRIV)
    assert causes == [
        {"reason": "FieldValueInvalid", "field": f"metadata.labels[{P}enforce]",
         "message": 'Invalid value: "strict": must be one of privileged, baseline, restricted'},
        {"reason": "FieldValueInvalid", "field": f"metadata.labels[{P}warn]",
         "message": 'Invalid value: "x": must be one of privileged, baseline, restricted'},
        {"reason": "FieldValueInvalid", "field": f"metadata.labels[{P}warn-version]",
         "message": 'Invalid value: "1.30": must be "latest" or "v1.x"'}]


# ------------------------------------------------------------------ decisions

def test_decide_enforce_refuses_with_every_violation() -> None:
    p = pod_obj()
    d = decide(Policy(enforce=R, warn=R), p["metadata"], p["spec"], enforce=True)
    assert d.denied == f'violates PodSecurity "restricted:latest": {BARE_RESTRICTED}'
    assert d.warnings == []  # no warning on a request refused anyway
    assert d.annotations == {ANNOTATION_ENFORCE_POLICY: "restricted:latest"}


def test_decide_warn_and_audit() -> None:
    p = privileged_pod()
    d = decide(Policy(enforce=PRIV, audit=LevelVersion("baseline", 28), warn=B), p["metadata"], p["spec"],
               enforce=True)
    reason = ('host namespaces (hostNetwork=true), '
              'privileged (container "c" must not set securityContext.privileged=true)')
    assert d.denied == ""
    assert d.warnings == [f'would violate PodSecurity "baseline:latest": {reason}']
    assert d.annotations == {ANNOTATION_ENFORCE_POLICY: "privileged:latest",
                             ANNOTATION_AUDIT_VIOLATIONS: f'would violate PodSecurity "baseline:v1.28": {reason}'}


def test_decide_templates_are_never_enforced() -> None:
    p = privileged_pod()
    d = decide(Policy(enforce=R, warn=R), p["metadata"], p["spec"], enforce=False)
    assert d.denied == "" and len(d.warnings) == 1 and ANNOTATION_ENFORCE_POLICY not in d.annotations


def test_decide_exempt_runtime_class() -> None:
    p = privileged_pod()
    p["spec"]["runtimeClassName"] = "kata"
    d = decide(Policy(R, R, R), p["metadata"], p["spec"], enforce=True, exempt_runtime_classes=frozenset({"kata"}))
    assert (d.denied, d.warnings, d.annotations) == ("", [], {ANNOTATION_EXEMPT: "runtimeClass"})


def test_significant_pod_update() -> None:
    old = privileged_pod()
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"a": "b"}
    relabelled["spec"]["activeDeadlineSeconds"] = 5
    assert not significant_pod_update(relabelled, old)
    new_image = copy.deepcopy(old)
    new_image["spec"]["containers"][0]["image"] = "nginx"
    assert significant_pod_update(new_image, old)
    debug = copy.deepcopy(old)
    debug["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "busybox"}]
    assert significant_pod_update(debug, old)
    seccomp = copy.deepcopy(old)
    seccomp["metadata"]["annotations"] = {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}
    assert significant_pod_update(seccomp, old)


def test_existing_pod_warnings_group_identical_violations() -> None:
    pods = [privileged_pod("zeta"), privileged_pod("alpha"), privileged_pod("mid"), good_pod("ok"),
            pod_obj("bare")]
    w = existing_pod_warnings("team", B, pods)
    assert w == [
        'existing pods in namespace "team" violate the new PodSecurity enforce level "baseline:latest"',
        "alpha (and 2 other pods): host namespaces, privileged"]
    w = existing_pod_warnings("team", R, [pod_obj("one"), pod_obj("two")])
    assert w[1] == ("one (and 1 other pod): allowPrivilegeEscalation != false, unrestricted capabilities, "
                    "runAsNonRoot != true, seccompProfile")
    # Distinct violations are listed sorted; past the limit Kubernetes says how many it checked.
    w = existing_pod_warnings("team", B, [privileged_pod("z"), pod_obj("y", hostIPC=True), pod_obj("x")],
                              max_pods=2)
    assert w == ["new PodSecurity enforce level only checked against the first 2 of 3 existing pods",
                 'existing pods in namespace "team" violate the new PodSecurity enforce level "baseline:latest"',
                 "y: host namespaces", "z: host namespaces, privileged"]


def test_existing_pods_one_per_controller_first() -> None:
    owned = []
    for i in range(3):
        p = privileged_pod(f"rs-{i}")
        p["metadata"]["ownerReferences"] = [{"uid": "rs", "controller": True, "kind": "ReplicaSet", "name": "rs"}]
        owned.append(p)
    lone = pod_obj("lone", hostPID=True)
    # With room for two pods, one replica and the lone pod are checked, not three replicas.
    w = existing_pod_warnings("team", B, [*owned, lone], max_pods=2)
    assert w == ["new PodSecurity enforce level only checked against the first 2 of 4 existing pods",
                 'existing pods in namespace "team" violate the new PodSecurity enforce level "baseline:latest"',
                 "lone: host namespaces", "rs-0: host namespaces, privileged"]
    kata = pod_obj("kata", hostPID=True, runtimeClassName="kata")
    assert existing_pod_warnings("team", B, [kata], frozenset({"kata"})) == []
    assert existing_pod_warnings("team", R, [good_pod()]) == []


# ------------------------------------------------------------------ configuration

def test_parse_config() -> None:
    cfg = parse_config({
        "apiVersion": "pod-security.admission.config.k8s.io/v1", "kind": "PodSecurityConfiguration",
        "defaults": {"enforce": "baseline", "enforce-version": "v1.29", "audit": "restricted", "warn": "restricted",
                     "warn-version": "latest"},
        "exemptions": {"usernames": ["ci"], "runtimeClasses": ["kata"], "namespaces": ["kube-system"]}})
    assert cfg == Config(Policy(LevelVersion("baseline", 29), R, R),
                         Exemptions(frozenset({"ci"}), frozenset({"kata"}), frozenset({"kube-system"})))
    wrapped = parse_config({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
                            "plugins": [{"name": "PodSecurity", "configuration": {
                                "apiVersion": "pod-security.admission.config.k8s.io/v1",
                                "kind": "PodSecurityConfiguration", "defaults": {"warn": "baseline"}}}]})
    assert wrapped.defaults == Policy(warn=B)


@pytest.mark.parametrize("doc,match", [
    ({"kind": "PodSecurityConfiguration", "apiVersion": "v1"}, "expected kind PodSecurityConfiguration"),
    ({"kind": "PodSecurityConfiguration", "apiVersion": "pod-security.admission.config.k8s.io/v1",
      "defaults": {"enforce": "strict"}}, "must be one of privileged, baseline, restricted"),
    ({"kind": "PodSecurityConfiguration", "apiVersion": "pod-security.admission.config.k8s.io/v1",
      "defaults": {"audit-version": "1.2"}}, 'must be "latest" or "v1.x"'),
    ({"kind": "PodSecurityConfiguration", "apiVersion": "pod-security.admission.config.k8s.io/v1",
      "exemptions": {"usernames": "ci"}}, "exemptions.usernames"),
])
def test_parse_config_refuses(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(doc)


# ------------------------------------------------------------------ the plugin alone

class FakeStore:
    def __init__(self, namespaces: dict[str, dict[str, str]], pods: list[dict[str, Any]] | None = None) -> None:
        self.namespaces = namespaces
        self.pods = pods or []

    async def get(self, key: str) -> dict[str, Any]:
        name = key.rsplit("/", 1)[1]
        if name not in self.namespaces:
            raise KeyNotFound(key)
        return {"metadata": {"name": name, "labels": self.namespaces[name]}}

    async def list(self, prefix: str) -> Any:
        class Page:
            items = self.pods
        return Page()


def attrs(verb: str = "create", resource: str = "pods", ns: str = "team", name: str = "p", group: str = "",
          sub: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, sub, ns, name)


async def run(plugin: PodSecurity, a: Attributes, obj: Any, old: Any = None,
              user: UserInfo = ADMIN) -> tuple[Exception | None, list[str], dict[str, str]]:
    ra = RequestAudit(None, DEFAULT_POLICY, request_uri="/", headers={})  # type: ignore[arg-type]
    token = CURRENT.set(ra)
    err = None
    try:
        with collect_warnings() as warnings:
            try:
                await plugin.validate(a, user, obj, old)
            except errors.APIError as e:
                err = e
    finally:
        CURRENT.reset(token)
    return err, warnings, ra.annotations


async def test_plugin_enforce_warn_audit_from_labels() -> None:
    store = FakeStore({"team": {P + "enforce": "baseline", P + "warn": "restricted", P + "audit": "restricted"}})
    plugin = PodSecurity(store)
    err, warnings, ann = await run(plugin, attrs(name="priv"), privileged_pod())
    assert isinstance(err, errors.Forbidden)
    assert err.message == ('pods "priv" is forbidden: violates PodSecurity "baseline:latest": host namespaces '
                           '(hostNetwork=true), privileged (container "c" must not set '
                           'securityContext.privileged=true)')
    assert warnings == []
    assert ann[ANNOTATION_ENFORCE_POLICY] == "baseline:latest"
    assert ann[ANNOTATION_AUDIT_VIOLATIONS].startswith('would violate PodSecurity "restricted:latest": '
                                                       'host namespaces (hostNetwork=true), privileged')
    err, warnings, ann = await run(plugin, attrs(), pod_obj())
    assert err is None
    assert warnings == [f'would violate PodSecurity "restricted:latest": {BARE_RESTRICTED}']
    assert ann[ANNOTATION_AUDIT_VIOLATIONS] == f'would violate PodSecurity "restricted:latest": {BARE_RESTRICTED}'


async def test_plugin_templates_warn_and_audit_only() -> None:
    plugin = PodSecurity(FakeStore({"team": {P + "enforce": "restricted", P + "warn": "restricted"}}))
    tmpl = {"metadata": {"labels": {"app": "x"}}, "spec": pod_obj()["spec"]}
    for group, resource, obj in [
            ("apps", "deployments", {"spec": {"template": tmpl}}),
            ("apps", "statefulsets", {"spec": {"template": tmpl}}),
            ("apps", "daemonsets", {"spec": {"template": tmpl}}),
            ("apps", "replicasets", {"spec": {"template": tmpl}}),
            ("batch", "jobs", {"spec": {"template": tmpl}}),
            ("batch", "cronjobs", {"spec": {"jobTemplate": {"spec": {"template": tmpl}}}}),
            ("", "replicationcontrollers", {"spec": {"template": tmpl}})]:
        err, warnings, ann = await run(plugin, attrs(resource=resource, group=group), obj)
        assert err is None, resource
        assert warnings == [f'would violate PodSecurity "restricted:latest": {BARE_RESTRICTED}'], resource
        assert ANNOTATION_ENFORCE_POLICY not in ann
    # Status and scale writes are not judged.
    err, warnings, _ = await run(plugin, attrs(verb="update", resource="deployments", group="apps", sub="scale"),
                                 {"spec": {"template": tmpl}})
    assert (err, warnings) == (None, [])


async def test_plugin_pod_updates_judged_only_when_significant() -> None:
    plugin = PodSecurity(FakeStore({"team": {P + "enforce": "restricted"}}))
    old = pod_obj()
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert (await run(plugin, attrs(verb="patch"), relabelled, old))[0] is None
    new_image = copy.deepcopy(old)
    new_image["spec"]["containers"][0]["image"] = "nginx"
    assert isinstance((await run(plugin, attrs(verb="update"), new_image, old))[0], errors.Forbidden)
    # Status, binding, eviction, exec... are not judged; other pod subresources are.
    for sub in ("status", "binding", "eviction", "exec", "attach", "portforward", "log", "proxy", "signal"):
        assert (await run(plugin, attrs(verb="update", sub=sub), new_image, old))[0] is None, sub
    assert isinstance((await run(plugin, attrs(verb="patch", sub="resize"), new_image, old))[0], errors.Forbidden)
    assert isinstance((await run(plugin, attrs(verb="update", sub="ephemeralcontainers"), new_image, old))[0],
                      errors.Forbidden)


async def test_plugin_exemptions_and_defaults() -> None:
    cfg = Config(Policy(enforce=R), Exemptions(frozenset({"ci-bot"}), frozenset({"kata"}), frozenset({"infra"})))
    plugin = PodSecurity(FakeStore({"team": {}, "infra": {}, "open": {P + "enforce": "privileged"}}), cfg)
    # The default applies to a namespace without labels.
    err, _, ann = await run(plugin, attrs(), pod_obj())
    assert isinstance(err, errors.Forbidden) and ann[ANNOTATION_ENFORCE_POLICY] == "restricted:latest"
    # A label overrides it.
    assert (await run(plugin, attrs(ns="open"), privileged_pod()))[0] is None
    err, _, ann = await run(plugin, attrs(ns="infra"), privileged_pod())
    assert err is None and ann == {ANNOTATION_EXEMPT: "namespace"}
    err, _, ann = await run(plugin, attrs(), privileged_pod(), user=UserInfo("ci-bot"))
    assert err is None and ann == {ANNOTATION_EXEMPT: "user"}
    p = privileged_pod()
    p["spec"]["runtimeClassName"] = "kata"
    err, _, ann = await run(plugin, attrs(), p)
    assert err is None and ann == {ANNOTATION_EXEMPT: "runtimeClass"}


async def test_plugin_exempt_namespace_labelled_is_warned() -> None:
    plugin = PodSecurity(FakeStore({}, pods=[privileged_pod()]),
                         Config(exemptions=Exemptions(namespaces=frozenset({"infra"}))))
    ns = {"metadata": {"name": "infra", "labels": {P + "enforce": "restricted", P + "warn": "baseline"}}}
    err, warnings, _ = await run(plugin, attrs(resource="namespaces", ns="", name="infra"), ns)
    assert err is None
    assert warnings == ['namespace "infra" is exempt from Pod Security, and the policy '
                        '(enforce=restricted:latest, warn=baseline:latest) will be ignored']
    err, warnings, _ = await run(plugin, attrs(verb="update", resource="namespaces", ns="", name="infra"), ns,
                                 {"metadata": {"name": "infra"}})
    assert err is None and len(warnings) == 1  # and no existing-pod dry run
    plain = {"metadata": {"name": "infra", "labels": {"team": "x"}}}
    assert (await run(plugin, attrs(resource="namespaces", ns="", name="infra"), plain))[:2] == (None, [])


async def test_plugin_default_changes_nothing() -> None:
    plugin = PodSecurity(FakeStore({"team": {}}))
    privileged = {ANNOTATION_ENFORCE_POLICY: "privileged:latest"}
    assert await run(plugin, attrs(), privileged_pod()) == (None, [], privileged)
    # A namespace that does not exist (yet) reads as unlabelled.
    assert await run(plugin, attrs(ns="ghost"), privileged_pod()) == (None, [], privileged)
    # Other kinds are not looked at.
    assert await run(plugin, attrs(resource="configmaps"), {"data": {}}) == (None, [], {})


async def test_plugin_namespace_labels() -> None:
    plugin = PodSecurity(FakeStore({}, pods=[privileged_pod("a"), pod_obj("b")]))
    ns = {"metadata": {"name": "team", "labels": {P + "enforce": "hard"}}}
    err, _, _ = await run(plugin, attrs(resource="namespaces", ns="", name="team"), ns)
    assert isinstance(err, errors.Invalid)
    assert err.message == (f'Namespace "team" is invalid: metadata.labels[{P}enforce]: Invalid value: "hard": '
                           'must be one of privileged, baseline, restricted')
    old = {"metadata": {"name": "team", "labels": {}}}
    new = {"metadata": {"name": "team", "labels": {P + "enforce": "baseline"}}}
    err, warnings, _ = await run(plugin, attrs(verb="update", resource="namespaces", ns="", name="team"), new, old)
    assert err is None
    assert warnings == [
        'existing pods in namespace "team" violate the new PodSecurity enforce level "baseline:latest"',
        "a: host namespaces, privileged"]
    # Relaxing the level (same version) dry-runs nothing.
    err, warnings, _ = await run(plugin, attrs(verb="update", resource="namespaces", ns="", name="team"), old, new)
    assert (err, warnings) == (None, [])


# ------------------------------------------------------------------ through the API

NS = "/api/v1/namespaces"


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        yield a


async def label_ns(api: Any, name: str, labels: dict[str, str]) -> Any:
    return await api.call("PATCH", f"{NS}/{name}", {"metadata": {"labels": labels}},
                          content_type="application/merge-patch+json")


async def test_api_enforce_refuses_with_every_field(api) -> None:
    assert (await api.json("POST", NS, {"metadata": {"name": "team"}}))[0] == 201
    resp = await label_ns(api, "team", {P + "enforce": "restricted"})
    assert resp.status == 200, resp.body
    code, err = await api.json("POST", f"{NS}/team/pods", privileged_pod())
    assert code == 403, err
    assert err["reason"] == "Forbidden"
    assert err["message"] == (
        'pods "priv" is forbidden: violates PodSecurity "restricted:latest": '
        'host namespaces (hostNetwork=true), '
        'privileged (container "c" must not set securityContext.privileged=true), '
        'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
        '"Localhost")')
    code, got = await api.json("POST", f"{NS}/team/pods", good_pod())
    assert code == 201, got
    # A Deployment is never refused; with enforce alone nothing is said (as Kubernetes),
    # with warn it is warned about.
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod_obj()["spec"]}}}
    resp = await api.call("POST", "/apis/apps/v1/namespaces/team/deployments", dep)
    assert resp.status == 201, resp.body
    assert "Warning" not in resp.headers
    assert (await label_ns(api, "team", {P + "warn": "restricted"})).status == 200
    dep["metadata"]["name"] = "d2"
    resp = await api.call("POST", "/apis/apps/v1/namespaces/team/deployments", dep)
    assert resp.status == 201, resp.body
    assert resp.headers["Warning"] == '299 - "would violate PodSecurity \\"restricted:latest\\": ' + \
        BARE_RESTRICTED.replace('"', '\\"') + '"'


async def test_api_warn_admits_with_warning_header(api) -> None:
    assert (await api.json("POST", NS, {"metadata": {"name": "team", "labels": {P + "warn": "baseline"}}}))[0] == 201
    resp = await api.call("POST", f"{NS}/team/pods", privileged_pod())
    assert resp.status == 201, resp.body
    assert resp.headers["Warning"].startswith('299 - "would violate PodSecurity \\"baseline:latest\\": '
                                              'host namespaces (hostNetwork=true)')
    # Default namespace, no labels: nothing said.
    resp = await api.call("POST", f"{NS}/default/pods", privileged_pod())
    assert resp.status == 201 and "Warning" not in resp.headers


async def test_api_namespace_labels_validated_and_existing_pods_warned(api) -> None:
    code, err = await api.json("POST", NS, {"metadata": {"name": "bad", "labels": {P + "audit-version": "1.30"}}})
    assert code == 422, err
    assert err["message"] == (f'Namespace "bad" is invalid: metadata.labels[{P}audit-version]: '
                              'Invalid value: "1.30": must be "latest" or "v1.x"')
    assert (await api.json("POST", NS, {"metadata": {"name": "team"}}))[0] == 201
    assert (await api.json("POST", f"{NS}/team/pods", privileged_pod("p1")))[0] == 201
    resp = await label_ns(api, "team", {P + "enforce": "baseline"})
    assert resp.status == 200, resp.body
    assert 'existing pods in namespace \\"team\\" violate the new PodSecurity enforce level' in resp.headers["Warning"]
    assert "p1: host namespaces, privileged" in resp.headers["Warning"]
    # The existing pod can still be relabelled (not a significant update).
    resp = await api.call("PATCH", f"{NS}/team/pods/p1", {"metadata": {"labels": {"a": "b"}}},
                          content_type="application/merge-patch+json")
    assert resp.status == 200, resp.body


# ------------------------------------------------------------------ the shared warning mechanism

def test_admission_warnings_reach_the_warning_header() -> None:
    from fleet.admission import add_warning
    from fleet.server.request_params import add_warning_headers

    add_warning("dropped: not in a request")  # no collector: a no-op
    with collect_warnings() as warnings:
        add_warning('would violate "x"')
        add_warning('would violate "x"')  # once
    assert warnings == ['would violate "x"']
    headers = {"Warning": '299 - "unknown field \\"spec.foo\\""'}
    add_warning_headers(headers, warnings)
    assert headers["Warning"] == '299 - "unknown field \\"spec.foo\\"", 299 - "would violate \\"x\\""'
    headers = {}
    add_warning_headers(headers, [])
    assert headers == {}
