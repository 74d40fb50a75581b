"""The ServiceAccount admission plugin: default account, existence check, the
`kube-api-access-*` token volume and mounts, mirror pods, mountable secrets.

First the pure functions, then the plugin over a real store (with and without its
watch-fed cache), then through the in-process API pipeline.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import trio
import trio.testing

from fleet.admission.serviceaccount import (
    DEFAULT_ACCOUNT_WAIT,
    DEFAULT_API_TOKEN_MOUNT_PATH,
    ServiceAccount,
    ServiceAccountCache,
    generate_volume_name,
    mirror_pod_violation,
    mount_service_account_token,
    secret_reference_violation,
    should_automount,
    token_volume_source,
)
from fleet.api import errors, meta
from fleet.auth import ADMIN, Attributes
from fleet.store import open_store
from fleet.testing.apiserver import open_api

PODS = "/api/v1/namespaces/default/pods"

# The exact volume kube-apiserver 1.32 adds (as `kubectl get pod -o json` shows it).
K8S_VOLUME = {
    "name": "kube-api-access-abcde",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ],
    },
}
K8S_MOUNT = {"name": "kube-api-access-abcde", "readOnly": True,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}


def fixed_name() -> str:
    return "kube-api-access-abcde"


def pod(name: str = "p", *, init: bool = False, annotations: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"},
                                        {"name": "d", "image": "busybox"}], **spec}
    if init:
        s["initContainers"] = [{"name": "i", "image": "busybox"}]
    md: dict[str, Any] = {"name": name, "namespace": "default"}
    if annotations:
        md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": s}


def account(name: str = "default", ns: str = "default", **fields: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns}
    if "annotations" in fields:
        md["annotations"] = fields.pop("annotations")
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": md, **fields}


def attrs(verb: str = "create", subresource: str = "", ns: str = "default") -> Attributes:
    return Attributes(verb, "", "v1", "pods", subresource, ns, "p")


# -- pure functions ----------------------------------------------------------------------


def test_token_volume_source_is_kubes_shape():
    assert {"name": "kube-api-access-abcde", "projected": token_volume_source()} == K8S_VOLUME


def test_generated_names_use_kubes_alphabet():
    names = {generate_volume_name() for _ in range(50)}
    assert all(re.fullmatch(r"kube-api-access-[bcdfghjklmnpqrstvwxz2456789]{5}", n) for n in names)
    assert len(names) > 1


@pytest.mark.parametrize("pod_setting, sa_setting, want", [
    (None, None, True), (None, True, True), (None, False, False),
    (True, False, True), (False, True, False), (False, None, False), (True, None, True),
])
def test_should_automount_pod_wins_then_account(pod_setting, sa_setting, want):
    spec = {} if pod_setting is None else {"automountServiceAccountToken": pod_setting}
    sa = account() if sa_setting is None else account(automountServiceAccountToken=sa_setting)
    assert should_automount(sa, spec) is want


def test_mount_adds_volume_and_mounts_in_init_and_app_containers():
    spec = pod(init=True)["spec"]
    mount_service_account_token(spec, fixed_name)
    assert spec["volumes"] == [K8S_VOLUME]
    for c in spec["initContainers"] + spec["containers"]:
        assert c["volumeMounts"] == [K8S_MOUNT]


def test_mount_keeps_an_existing_mount_at_the_token_path():
    spec = pod()["spec"]
    own = {"name": "mine", "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH}
    spec["containers"][0]["volumeMounts"] = [own]
    spec["volumes"] = [{"name": "mine", "emptyDir": {}}]
    mount_service_account_token(spec, fixed_name)
    assert spec["containers"][0]["volumeMounts"] == [own]
    assert spec["containers"][1]["volumeMounts"] == [K8S_MOUNT]
    assert spec["volumes"] == [{"name": "mine", "emptyDir": {}}, K8S_VOLUME]


def test_mount_adds_no_volume_when_every_container_has_its_own():
    spec = pod()["spec"]
    for c in spec["containers"]:
        c["volumeMounts"] = [{"name": "mine", "mountPath": DEFAULT_API_TOKEN_MOUNT_PATH}]
    spec["volumes"] = [{"name": "mine", "emptyDir": {}}]
    before = copy.deepcopy(spec)
    mount_service_account_token(spec, fixed_name)
    assert spec == before


def test_mount_reuses_an_existing_kube_api_access_volume():
    spec = pod()["spec"]
    existing = {"name": "kube-api-access-zzzzz", "projected": token_volume_source()}
    spec["volumes"] = [existing]
    mount_service_account_token(spec, fixed_name)
    assert spec["volumes"] == [existing]
    assert spec["containers"][0]["volumeMounts"] == [dict(K8S_MOUNT, name="kube-api-access-zzzzz")]


def test_mirror_pod_rules():
    assert mirror_pod_violation(pod()) is None
    assert mirror_pod_violation(pod(serviceAccountName="x")) == \
        "a mirror pod may not reference service accounts"
    assert mirror_pod_violation(pod(volumes=[{"name": "s", "secret": {"secretName": "x"}}])) == \
        "a mirror pod may not reference secrets"
    assert mirror_pod_violation(pod(imagePullSecrets=[{"name": "x"}])) == \
        "a mirror pod may not reference secrets"
    assert mirror_pod_violation(pod(volumes=[{"name": "t", "projected": token_volume_source()}])) == \
        "a mirror pod may not use ServiceAccountToken volume projections"


def test_secret_reference_rules():
    sa = account("builder", secrets=[{"name": "ok"}], imagePullSecrets=[{"name": "pull"}])
    assert secret_reference_violation(sa, pod(volumes=[{"name": "v", "secret": {"secretName": "ok"}}],
                                              imagePullSecrets=[{"name": "pull"}])["spec"]) is None
    assert secret_reference_violation(sa, pod(volumes=[{"name": "v", "secret": {"secretName": "no"}}])["spec"]) \
        == 'volume with secret.secretName="no" is not allowed because service account builder does not ' \
           'reference that secret'
    spec = pod()["spec"]
    spec["containers"][0]["env"] = [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "no", "key": "k"}}}]
    assert secret_reference_violation(sa, spec) == (
        'container c with envVar E referencing secret.secretName="no" is not allowed because service '
        'account builder does not reference that secret')
    assert secret_reference_violation(sa, pod(imagePullSecrets=[{"name": "other"}])["spec"]) == (
        'imagePullSecrets[0].name="other" is not allowed because service account builder does not '
        'reference that imagePullSecret')


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# -- the plugin over a store -------------------------------------------------------------


@pytest.fixture(params=["store", "cache"])
async def store_plugin(request, tmp_path):
    """A store with accounts default/default, default/robot (automount off) and
    default/puller (a pull secret); the plugin reads it directly or through a cache."""
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        for sa in (account(), account("robot", automountServiceAccountToken=False),
                   account("puller", imagePullSecrets=[{"name": "regcred"}]),
                   account("strict", annotations={"kubernetes.io/enforce-mountable-secrets": "true"},
                           secrets=[{"name": "allowed"}])):
            await store.create(meta.store_key("", "serviceaccounts", "default", sa["metadata"]["name"]), sa)
        async with trio.open_nursery() as nursery:
            cache = None
            if request.param == "cache":
                cache = ServiceAccountCache()
                await nursery.start(cache.run, store)
            yield ServiceAccount(store, cache, mount_tokens=True, generate_name=fixed_name), store
            nursery.cancel_scope.cancel()


async def admit(plugin: ServiceAccount, obj: dict[str, Any], a: Attributes | None = None) -> dict[str, Any]:
    a = a or attrs()
    out = await plugin.mutate(a, ADMIN, obj, None)
    await plugin.validate(a, ADMIN, out, None)
    return out


async def test_defaults_the_account_and_mounts_the_token(store_plugin):
    plugin, _ = store_plugin
    got = await admit(plugin, pod(init=True))
    spec = got["spec"]
    assert (spec["serviceAccountName"], spec["serviceAccount"]) == ("default", "default")
    assert spec["volumes"] == [K8S_VOLUME]
    assert [c["volumeMounts"] for c in spec["initContainers"] + spec["containers"]] == [[K8S_MOUNT]] * 3
    assert "imagePullSecrets" not in spec


async def test_automount_off_on_the_pod(store_plugin):
    plugin, _ = store_plugin
    got = await admit(plugin, pod(automountServiceAccountToken=False))
    assert "volumes" not in got["spec"]
    assert all(not c.get("volumeMounts") for c in got["spec"]["containers"])


async def test_automount_off_on_the_account_and_pod_override(store_plugin):
    plugin, _ = store_plugin
    got = await admit(plugin, pod(serviceAccountName="robot"))
    assert "volumes" not in got["spec"] and got["spec"]["serviceAccount"] == "robot"
    got = await admit(plugin, pod(serviceAccountName="robot", automountServiceAccountToken=True))
    assert got["spec"]["volumes"] == [K8S_VOLUME]


async def test_pull_secrets_come_from_the_account_unless_the_pod_has_some(store_plugin):
    plugin, _ = store_plugin
    got = await admit(plugin, pod(serviceAccountName="puller"))
    assert got["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    got = await admit(plugin, pod(serviceAccountName="puller", imagePullSecrets=[{"name": "mine"}]))
    assert got["spec"]["imagePullSecrets"] == [{"name": "mine"}]


async def test_missing_account_is_403_in_kubes_words(store_plugin):
    plugin, _ = store_plugin
    with pytest.raises(errors.Forbidden) as e:
        await admit(plugin, pod(serviceAccountName="ghost"))
    assert str(e.value.message) == ('pods "p" is forbidden: error looking up service account '
                                     'default/ghost: serviceaccount "ghost" not found')


async def test_missing_default_account_is_waited_for_then_403(store_plugin, autojump_clock):
    plugin, _ = store_plugin
    start = trio.current_time()
    with pytest.raises(errors.Forbidden) as e:
        await plugin.mutate(attrs(ns="fresh"), ADMIN, pod(), None)
    assert 'error looking up service account fresh/default: serviceaccount "default" not found' \
        in e.value.message
    assert DEFAULT_ACCOUNT_WAIT - 0.2 <= trio.current_time() - start <= DEFAULT_ACCOUNT_WAIT
    # Any other name is looked up once.
    start = trio.current_time()
    with pytest.raises(errors.Forbidden):
        await plugin.mutate(attrs(ns="fresh"), ADMIN, pod(serviceAccountName="builder"), None)
    assert trio.current_time() == start


async def test_default_account_created_during_the_retries_is_found(store_plugin):
    plugin, store = store_plugin
    async with trio.open_nursery() as n:
        async def create_later() -> None:
            await trio.sleep(0.3)
            await store.create(meta.store_key("", "serviceaccounts", "late", "default"),
                               account(ns="late"))
        n.start_soon(create_later)
        got = await admit(plugin, pod(), attrs(ns="late"))
    assert got["spec"]["volumes"] == [K8S_VOLUME]


async def test_only_pod_creates_are_touched(store_plugin):
    plugin, _ = store_plugin
    for a in (attrs("update"), attrs("create", "status"), attrs("create", "binding"),
              Attributes("create", "", "v1", "configmaps", "", "default", "p")):
        obj = pod()
        assert await plugin.mutate(a, ADMIN, copy.deepcopy(obj), None) == obj
        await plugin.validate(a, ADMIN, obj, None)


async def test_mirror_pods_are_left_alone_and_guarded(store_plugin):
    plugin, _ = store_plugin
    mirror = {"kubernetes.io/config.mirror": "abc"}
    obj = pod(annotations=mirror)
    assert await admit(plugin, copy.deepcopy(obj)) == obj
    with pytest.raises(errors.Forbidden) as e:
        await admit(plugin, pod(annotations=mirror, serviceAccountName="default"))
    assert e.value.message.endswith("a mirror pod may not reference service accounts")


async def test_enforce_mountable_secrets(store_plugin):
    plugin, _ = store_plugin
    await admit(plugin, pod(serviceAccountName="strict",
                            volumes=[{"name": "v", "secret": {"secretName": "allowed"}}]))
    with pytest.raises(errors.Forbidden) as e:
        await admit(plugin, pod(serviceAccountName="strict",
                                volumes=[{"name": "v", "secret": {"secretName": "other"}}]))
    assert 'secret.secretName="other" is not allowed because service account strict' in e.value.message


async def test_mount_tokens_off_still_defaults_and_checks(tmp_path):
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        await store.create(meta.store_key("", "serviceaccounts", "default", "default"), account())
        plugin = ServiceAccount(store, mount_tokens=False)
        got = await admit(plugin, pod())
        assert got["spec"]["serviceAccountName"] == "default" and "volumes" not in got["spec"]


# -- through the API pipeline ------------------------------------------------------------


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path, builtin_admission=True) as a:
        for p in a.server.admission.mutating:
            if isinstance(p, ServiceAccount):
                p.mount_tokens = True
        yield a


async def test_pipeline_pod_gets_the_volume_and_it_validates(api):
    code, got = await api.json("POST", PODS, pod(init=True))
    assert code == 201, got
    spec = got["spec"]
    (vol,) = spec["volumes"]
    assert re.fullmatch(r"kube-api-access-[bcdfghjklmnpqrstvwxz2456789]{5}", vol["name"])
    assert dict(vol, name="kube-api-access-abcde") == K8S_VOLUME
    for c in spec["initContainers"] + spec["containers"]:
        assert c["volumeMounts"] == [dict(K8S_MOUNT, name=vol["name"])]
    assert (spec["serviceAccountName"], spec["serviceAccount"]) == ("default", "default")


async def test_pipeline_missing_account_is_403(api):
    code, body = await api.json("POST", PODS, pod(serviceAccountName="ghost"))
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"] == ('pods "p" is forbidden: error looking up service account default/ghost: '
                               'serviceaccount "ghost" not found')


async def test_pipeline_new_namespace_gets_its_default_account_in_time(api):
    assert (await api.json("POST", "/api/v1/namespaces",
                           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}}))[0] == 201
    body = pod()
    body["metadata"]["namespace"] = "fresh"
    code, got = await api.json("POST", "/api/v1/namespaces/fresh/pods", body)
    assert code == 201, got
    assert got["spec"]["volumes"][0]["name"].startswith("kube-api-access-")
