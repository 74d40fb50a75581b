"""Container environment resolution: order, expansion, valueFrom sources and errors."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from fleet.agent.env import EnvError, field_value, resolve_env, resource_value


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


OBJECTS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("ConfigMap", "ns1", "cfg"): {"data": {"A": "from-cm", "B": "bee", "bad=key": "x"}},
    ("ConfigMap", "ns1", "other"): {"data": {"A": "other-a"}},
    ("Secret", "ns1", "sec"): {"data": {"PASSWORD": b64("s3cret"), "A": b64("from-secret")}},
}


class Lookup:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    async def __call__(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append((kind, namespace, name))
        return OBJECTS.get((kind, namespace, name))


POD: dict[str, Any] = {
    "metadata": {"name": "web-1", "namespace": "ns1", "uid": "u-123",
                 "labels": {"app": "web", "tier": "front"},
                 "annotations": {"note": 'say "hi"'}},
    "spec": {
        "nodeName": "node-a", "serviceAccountName": "builder",
        "containers": [
            {"name": "main", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"},
                                           "requests": {"cpu": "250m", "memory": "32Mi"}}},
            {"name": "side"},
        ],
    },
    "status": {"podIP": "10.42.0.7", "podIPs": [{"ip": "10.42.0.7"}, {"ip": "fd00::7"}],
               "hostIP": "192.168.1.10"},
}
ALLOCATABLE = {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi"}


async def test_order_envfrom_then_env_with_expansion() -> None:
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cfg"}},
                    {"secretRef": {"name": "sec"}, "prefix": "S_"}],
        "env": [
            {"name": "GREETING", "value": "hello $(B) $(S_PASSWORD) $(LATER) $$(B)"},
            {"name": "A", "value": "overridden"},
            {"name": "LATER", "value": "late"},
            {"name": "USES_A", "value": "$(A)"},
        ],
    }
    env = await resolve_env(POD, container, Lookup(), base_env={"A": "base", "KEEP": "k"})
    assert env == {
        "KEEP": "k",
        "A": "overridden",
        "B": "bee",
        "S_PASSWORD": "s3cret",
        "S_A": "from-secret",
        # LATER is defined after GREETING, so its reference stays verbatim.
        "GREETING": "hello bee s3cret $(LATER) $(B)",
        "LATER": "late",
        "USES_A": "overridden",
    }
    assert "bad=key" not in env


async def test_later_envfrom_overrides_earlier() -> None:
    container = {"name": "main", "envFrom": [{"configMapRef": {"name": "cfg"}},
                                             {"configMapRef": {"name": "other"}}]}
    env = await resolve_env(POD, container, Lookup())
    assert env["A"] == "other-a"


async def test_each_object_is_looked_up_once() -> None:
    lookup = Lookup()
    container = {"name": "main", "envFrom": [{"configMapRef": {"name": "cfg"}}],
                 "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "B"}}},
                         {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "A"}}}]}
    env = await resolve_env(POD, container, lookup)
    assert (env["X"], env["Y"]) == ("bee", "from-cm")
    assert lookup.calls == [("ConfigMap", "ns1", "cfg")]


@pytest.mark.parametrize(("value_from", "want"), [
    ({"configMapKeyRef": {"name": "cfg", "key": "B"}}, "bee"),
    ({"secretKeyRef": {"name": "sec", "key": "PASSWORD"}}, "s3cret"),
    ({"configMapKeyRef": {"name": "nope", "key": "B", "optional": True}}, None),
    ({"configMapKeyRef": {"name": "cfg", "key": "nokey", "optional": True}}, None),
    ({"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}, None),
    ({"fieldRef": {"fieldPath": "metadata.name"}}, "web-1"),
    ({"fieldRef": {"fieldPath": "metadata.namespace"}}, "ns1"),
    ({"fieldRef": {"fieldPath": "metadata.uid"}}, "u-123"),
    ({"fieldRef": {"fieldPath": "metadata.labels['app']"}}, "web"),
    ({"fieldRef": {"fieldPath": "metadata.labels['missing']"}}, ""),
    ({"fieldRef": {"fieldPath": "metadata.annotations['note']"}}, 'say "hi"'),
    ({"fieldRef": {"fieldPath": "spec.nodeName"}}, "node-a"),
    ({"fieldRef": {"fieldPath": "spec.serviceAccountName"}}, "builder"),
    ({"fieldRef": {"fieldPath": "status.podIP"}}, "10.42.0.7"),
    ({"fieldRef": {"fieldPath": "status.podIPs"}}, "10.42.0.7,fd00::7"),
    ({"fieldRef": {"fieldPath": "status.hostIP"}}, "192.168.1.10"),
    # millicores → cores, rounded up
    ({"resourceFieldRef": {"resource": "limits.cpu"}}, "1"),
    ({"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}, "500"),
    ({"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}, "250"),
    ({"resourceFieldRef": {"resource": "requests.cpu"}}, "1"),
    ({"resourceFieldRef": {"resource": "limits.memory"}}, str(64 * 2**20)),
    ({"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}, "64"),
    ({"resourceFieldRef": {"resource": "requests.memory", "divisor": "1M"}}, "34"),
    # unset limits fall back to the node's allocatable
    ({"resourceFieldRef": {"containerName": "side", "resource": "limits.cpu"}}, "4"),
    ({"resourceFieldRef": {"containerName": "side", "resource": "limits.memory",
                           "divisor": "1Gi"}}, "8"),
    ({"resourceFieldRef": {"containerName": "side", "resource": "limits.ephemeral-storage",
                           "divisor": "1Gi"}}, "100"),
    ({"resourceFieldRef": {"containerName": "side", "resource": "requests.memory"}}, "0"),
])
async def test_value_from(value_from: dict[str, Any], want: str | None) -> None:
    container = {"name": "main", "env": [{"name": "V", "valueFrom": value_from}]}
    env = await resolve_env(POD, container, Lookup(), node_allocatable=ALLOCATABLE)
    assert env.get("V") == want
    assert ("V" in env) == (want is not None)


async def test_sandbox_ips_override_status() -> None:
    container = {"name": "main", "env": [
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIPs"}}}]}
    env = await resolve_env({"metadata": {"namespace": "ns1"}}, container, Lookup(),
                            pod_ips=["10.1.2.3"], host_ips=["192.0.2.1", "2001:db8::1"])
    assert env == {"IP": "10.1.2.3", "HOST": "192.0.2.1,2001:db8::1"}


@pytest.mark.parametrize(("container", "message"), [
    ({"envFrom": [{"configMapRef": {"name": "nope"}}]}, 'configmap "nope" not found'),
    ({"envFrom": [{"secretRef": {"name": "nope"}}]}, 'secret "nope" not found'),
    ({"env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}]},
     'configmap "nope" not found'),
    ({"env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]},
     'secret "nope" not found'),
    ({"env": [{"name": "V", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]},
     "couldn't find key k in ConfigMap ns1/cfg"),
    ({"env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "k"}}}]},
     "couldn't find key k in Secret ns1/sec"),
    ({"env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]},
     "unsupported fieldPath: spec.bogus"),
    ({"env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}}]},
     "unsupported fieldPath: metadata.labels"),
    ({"env": [{"name": "V", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]},
     "unsupported container resource: limits.gpu"),
    ({"env": [{"name": "V", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu",
                                                                "divisor": "0"}}}]},
     "divisor must be positive"),
])
async def test_missing_references_fail_with_config_error(container: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(EnvError) as info:
        await resolve_env(POD, {"name": "main", **container}, Lookup())
    assert info.value.reason == "CreateContainerConfigError"
    assert message in info.value.message


async def test_optional_envfrom_missing_is_skipped() -> None:
    container = {"name": "main", "envFrom": [{"configMapRef": {"name": "nope", "optional": True}},
                                             {"secretRef": {"name": "nope2", "optional": True}}],
                 "env": [{"name": "X", "value": "1"}]}
    assert await resolve_env(POD, container, Lookup()) == {"X": "1"}


async def test_secret_bytes_survive_and_bad_base64_is_an_error() -> None:
    raw = bytes([0x66, 0xFF, 0x00])
    objects = {("Secret", "ns1", "bin"): {"data": {"K": base64.b64encode(raw).decode()}},
               ("Secret", "ns1", "bad"): {"data": {"K": "!!!not base64"}}}

    async def lookup(kind: str, ns: str, name: str) -> dict[str, Any] | None:
        return objects.get((kind, ns, name))

    env = await resolve_env(POD, {"name": "main", "envFrom": [{"secretRef": {"name": "bin"}}]},
                            lookup)
    import os
    assert os.fsencode(env["K"]) == raw
    with pytest.raises(EnvError, match="base64"):
        await resolve_env(POD, {"name": "main", "envFrom": [{"secretRef": {"name": "bad"}}]},
                          lookup)


def test_whole_label_map_for_volumes() -> None:
    assert field_value(POD, "metadata.labels", allow_whole_maps=True) == 'app="web"\ntier="front"'
    assert field_value(POD, "metadata.annotations", allow_whole_maps=True) == 'note="say \\"hi\\""'


def test_resource_value_unknown_container() -> None:
    with pytest.raises(EnvError, match='container "ghost" not found'):
        resource_value(POD, "ghost", "limits.cpu", None, ALLOCATABLE)
