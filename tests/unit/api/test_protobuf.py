"""fleet.api.protobuf: Kubernetes protobuf bodies decode to the dicts their JSON encoding gives.

The `CAPTURED` bodies are byte for byte what kubectl 1.32 POSTed to a Fleet server (through a
recording proxy) for the command named with each; the expected dicts are what
`kubectl ... --dry-run=client -o json` prints for the same command, less the
`creationTimestamp: null` this decoder leaves out.  The synthetic bodies below them exercise
the wire format corners kubectl's commands do not reach.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from fleet.api import errors, protobuf
from fleet.server.http import Req
from fleet.server.request_params import decode_body as rest_decode_body


def b64(*lines: str) -> bytes:
    return base64.b64decode("".join(lines))


NS_DEMO = {"name": "x", "namespace": "demo"}

# (kubectl command, captured body, expected dict)
CAPTURED: list[tuple[str, bytes, dict[str, Any]]] = [
    (
        "create namespace demo",
        b64("azhzAAoPCgJ2MRIJTmFtZXNwYWNlEhwKFAoEZGVtbxIAGgAiACoAMgA4AEIAEgAaAgoAGgAiAA=="),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"},
         "spec": {}, "status": {}},
    ),
    (
        "-n demo create configmap x --from-literal=a=b",
        b64("azhzAAoPCgJ2MRIJQ29uZmlnTWFwEh8KFQoBeBIAGgRkZW1vIgAqADIAOABCABIGCgFhEgFiGgAiAA=="),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": NS_DEMO, "data": {"a": "b"}},
    ),
    (
        "-n n create configmap multi --from-literal=empty= --from-literal=k=v",
        b64("azhzAAoPCgJ2MRIJQ29uZmlnTWFwEisKFgoFbXVsdGkSABoBbiIAKgAyADgAQgASCQoFZW1wdHkSABIGCgFrEgF2",
            "GgAiAA=="),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "multi", "namespace": "n"},
         "data": {"empty": "", "k": "v"}},
    ),
    (
        "-n demo create secret generic s --from-literal=p=q",
        b64("azhzAAoMCgJ2MRIGU2VjcmV0EiEKFQoBcxIAGgRkZW1vIgAqADIAOABCABIGCgFwEgFxGgAaACIA"),
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "demo"},
         "data": {"p": "cQ=="}},
    ),
    (
        "-n n create secret generic bin --from-literal=x=$'\\xff'",
        b64("azhzAAoMCgJ2MRIGU2VjcmV0EiAKFAoDYmluEgAaAW4iACoAMgA4AEIAEgYKAXgSAf8aABoAIgA="),
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bin", "namespace": "n"},
         "data": {"x": "/w=="}},
    ),
    (
        "-n demo create serviceaccount sa",
        b64("azhzAAoUCgJ2MRIOU2VydmljZUFjY291bnQSGAoWCgJzYRIAGgRkZW1vIgAqADIAOABCABoAIgA="),
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "sa", "namespace": "demo"}},
    ),
    (
        "-n demo create deployment web --image=busybox --replicas=2 --port=80",
        b64("azhzAAoVCgdhcHBzL3YxEgpEZXBsb3ltZW50EsABCiMKA3dlYhIAGgRkZW1vIgAqADIAOABCAFoKCgNhcHASA3dl",
            "YhKKAQgCEgwKCgoDYXBwEgN3ZWIacAocCgASABoAIgAqADIAOABCAFoKCgNhcHASA3dlYhJQEjIKB2J1c3lib3gS",
            "B2J1c3lib3gqADIKCgAQABhQIgAqAEIAagByAIABAIgBAJABAKIBABoAMgBCAEoAUgBYAGAAaACCAQCKAQCaAQDC",
            "AQAiAgoAKAA4ABoMCAAQABgAIAAoADgAGgAiAA=="),
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "web", "namespace": "demo", "labels": {"app": "web"}},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "strategy": {},
                  "template": {"metadata": {"labels": {"app": "web"}},
                               "spec": {"containers": [{"name": "busybox", "image": "busybox",
                                                        "ports": [{"containerPort": 80}],
                                                        "resources": {}}]}}},
         "status": {}},
    ),
    (
        "-n n create deployment zero --image=nginx:1.25 --replicas=0",
        b64("azhzAAoVCgdhcHBzL3YxEgpEZXBsb3ltZW50ErYBCiIKBHplcm8SABoBbiIAKgAyADgAQgBaCwoDYXBwEgR6ZXJv",
            "EoEBCAASDQoLCgNhcHASBHplcm8aZgodCgASABoAIgAqADIAOABCAFoLCgNhcHASBHplcm8SRRInCgVuZ2lueBIK",
            "bmdpbng6MS4yNSoAQgBqAHIAgAEAiAEAkAEAogEAGgAyAEIASgBSAFgAYABoAIIBAIoBAJoBAMIBACICCgAoADgA",
            "GgwIABAAGAAgACgAOAAaACIA"),
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "zero", "namespace": "n", "labels": {"app": "zero"}},
         # replicas is a pointer in Go: an explicit 0 must survive (it is not "unset").
         "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "zero"}}, "strategy": {},
                  "template": {"metadata": {"labels": {"app": "zero"}},
                               "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25",
                                                        "resources": {}}]}}},
         "status": {}},
    ),
    (
        "-n demo create job j --image=busybox -- echo hi",
        b64("azhzAAoPCghiYXRjaC92MRIDSm9iEoYBChUKAWoSABoEZGVtbyIAKgAyADgAQgASYzJhChAKABIAGgAiACoAMgA4",
            "AEIAEk0SKgoBahIHYnVzeWJveBoEZWNobxoCaGkqAEIAagByAIABAIgBAJABAKIBABoFTmV2ZXIyAEIASgBSAFgA",
            "YABoAIIBAIoBAJoBAMIBABoIIAAoADAAOgAaACIA"),
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "demo"},
         "spec": {"template": {"metadata": {},
                               "spec": {"containers": [{"name": "j", "image": "busybox",
                                                        "command": ["echo", "hi"],
                                                        "resources": {}}],
                                        "restartPolicy": "Never"}}},
         "status": {}},
    ),
    (
        "-n demo create cronjob c --image=busybox --schedule='*/5 * * * *'",
        b64("azhzAAoTCghiYXRjaC92MRIHQ3JvbkpvYhKfAQoVCgFjEgAaBGRlbW8iACoAMgA4AEIAEoMBCgsqLzUgKiAqICog",
            "KhoAKnIKEQoBYxIAGgAiACoAMgA4AEIAEl0yWwoQCgASABoAIgAqADIAOABCABJHEiAKAWMSB2J1c3lib3gqAEIA",
            "agByAIABAIgBAJABAKIBABoJT25GYWlsdXJlMgBCAEoAUgBYAGAAaACCAQCKAQCaAQDCAQAaABoAIgA="),
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "demo"},
         "spec": {"schedule": "*/5 * * * *",
                  "jobTemplate": {"metadata": {"name": "c"},
                                  "spec": {"template": {"metadata": {}, "spec": {
                                      "containers": [{"name": "c", "image": "busybox",
                                                      "resources": {}}],
                                      "restartPolicy": "OnFailure"}}}}},
         "status": {}},
    ),
    (
        "-n demo create service clusterip s --tcp=80:8080",
        b64("azhzAAoNCgJ2MRIHU2VydmljZRJnCh8KAXMSABoEZGVtbyIAKgAyADgAQgBaCAoDYXBwEgFzEkAKGwoHODAtODA4",
            "MBIDVENQGFAiBwgAEJA/GgAoABIICgNhcHASAXMaACIJQ2x1c3RlcklQOgBCAFIAWgBgAGgAGgIKABoAIgA="),
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "s", "namespace": "demo", "labels": {"app": "s"}},
         "spec": {"ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                  "selector": {"app": "s"}, "type": "ClusterIP"},
         "status": {"loadBalancer": {}}},
    ),
    (
        "-n n create service nodeport np --tcp=80:8080 --node-port=30080",
        b64("azhzAAoNCgJ2MRIHU2VydmljZRJoCh4KAm5wEgAaAW4iACoAMgA4AEIAWgkKA2FwcBICbnASQgodCgc4MC04MDgw",
            "EgNUQ1AYUCIHCAAQkD8aACiA6wESCQoDYXBwEgJucBoAIghOb2RlUG9ydDoAQgBSAFoAYABoABoCCgAaACIA"),
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "np", "namespace": "n", "labels": {"app": "np"}},
         "spec": {"ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080,
                             "nodePort": 30080}],
                  "selector": {"app": "np"}, "type": "NodePort"},
         "status": {"loadBalancer": {}}},
    ),
]

# `kubectl -n demo create job rich-now --from=cronjob/rich`, the CronJob having been applied with
# volumes, env valueFrom, envFrom, probes, resources and a securityContext: kubectl copies the
# job template (with the server's defaults) into a Job with an ownerReference.
RICH_JOB = b64(
    "azhzAAoPCghiYXRjaC92MRIDSm9iEtIFCowBCghyaWNoLW5vdxIAGgRkZW1vIgAqADIAOABCAGIrCiFjcm9uam9i",
    "Lmt1YmVybmV0ZXMuaW8vaW5zdGFudGlhdGUSBm1hbnVhbGpBCgdDcm9uSm9iGgRyaWNoIiRhNTUyMjdkZi0zMTcw",
    "LTRhMzktOTgxNC0xZWMxMmFlZjU4NjcqCGJhdGNoL3YxMAEStgQIARABMooECh0KABIAGgAiACoAMgA4AEIAWgsK",
    "A2FwcBIEcmljaBLoAwoPCgdzY3JhdGNoEgQSAgoAChIKA2NmZxILmgEICgMKAXgYpAMKEQoDc2VjEgoyCAoBcxik",
    "AyABEugCCgRtYWluEgdidXN5Ym94IgJzaCICLWMiBHRydWUqBS93b3JrMhIKBGh0dHAQABiQPyIDVENQKgA6BgoB",
    "QRIBMToRCgFCEgAaChoICgMKAXgSAWE6HgoDUE9EEgAaFQoTCgJ2MRINbWV0YWRhdGEubmFtZUIxCg0KA2NwdRIG",
    "CgQ1MDBtChEKBm1lbW9yeRIHCgUxMjhNaRINCgNjcHUSBgoEMTAwbUoWCgdzY3JhdGNoEAAaBS93b3JrIgAyAEoV",
    "CgNjZmcQARoIL2V0Yy9jZmciADIAUhkKDRoLCgcIABCQPxoAEgAQABgBIAooATADWiwKIBIeCggvaGVhbHRoehIK",
    "CAEQABoEaHR0cBoAIgRIVFRQEAAYASAFKAEwA2oUL2Rldi90ZXJtaW5hdGlvbi1sb2dyBkFsd2F5c3oLCgUSA0FM",
    "TCAAOACAAQCIAQCQAQCaAQwKA0NNXxIFCgMKAXiiAQRGaWxlGgVOZXZlciAeMgxDbHVzdGVyRmlyc3RCAEoAUgBY",
    "AGAAaAByAIIBAIoBAJoBEWRlZmF1bHQtc2NoZWR1bGVywgEA8AEBOABKCk5vbkluZGV4ZWRQAHITVGVybWluYXRp",
    "bmdPckZhaWxlZBoIIAAoADAAOgAaACIA",
)


@pytest.mark.parametrize(("command", "body", "expected"), CAPTURED,
                         ids=[c[0].split(" create ")[-1].split(" --")[0] for c in CAPTURED])
def test_captured_kubectl_bodies(command: str, body: bytes, expected: dict[str, Any]) -> None:
    assert protobuf.decode_body(body) == expected, command


def test_job_from_cronjob_with_inline_fields_quantities_and_probes() -> None:
    job = protobuf.decode_body(RICH_JOB)
    assert job["metadata"] == {
        "name": "rich-now", "namespace": "demo",
        "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "rich",
                             "uid": "a55227df-3170-4a39-9814-1ec12aef5867", "controller": True}],
    }
    spec = job["spec"]
    # Pointer fields keep their zero / false; non-pointer zeros are unset.
    assert spec["backoffLimit"] == 0 and spec["suspend"] is False
    assert spec["completions"] == 1 and spec["completionMode"] == "NonIndexed"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 30
    assert pod["securityContext"] == {}
    # Volume.volumeSource and LocalObjectReference are inlined, as in JSON.
    assert pod["volumes"] == [
        {"name": "scratch", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "x", "defaultMode": 420}},
        {"name": "sec", "secret": {"secretName": "s", "defaultMode": 420, "optional": True}},
    ]
    (c,) = pod["containers"]
    assert c["args"] == ["sh", "-c", "true"] and c["workingDir"] == "/work"
    assert c["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "a"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                   "fieldPath": "metadata.name"}}},
    ]
    assert c["envFrom"] == [{"prefix": "CM_", "configMapRef": {"name": "x"}}]
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["resources"] == {"limits": {"cpu": "500m", "memory": "128Mi"},
                              "requests": {"cpu": "100m"}}
    assert c["volumeMounts"] == [{"name": "scratch", "mountPath": "/work"},
                                 {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True}]
    # Probe.handler is inlined; IntOrString comes out as str or int.
    assert c["readinessProbe"] == {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                                   "periodSeconds": 5, "timeoutSeconds": 1,
                                   "successThreshold": 1, "failureThreshold": 3}
    assert c["livenessProbe"]["tcpSocket"] == {"port": 8080}
    assert c["securityContext"] == {"runAsUser": 0, "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}
    assert c["imagePullPolicy"] == "Always"
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "File"
    assert job["status"] == {}


# -- synthetic bodies -----------------------------------------------------------------------

def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(num: int, wire: int) -> bytes:
    return varint(num << 3 | wire)


def vi(num: int, n: int) -> bytes:
    return key(num, 0) + varint(n)


def ld(num: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return key(num, 2) + varint(len(data)) + data


def entry(num: int, k: str, v: bytes | str) -> bytes:
    return ld(num, ld(1, k) + ld(2, v))


def envelope(api_version: str, kind: str, raw: bytes, encoding: str = "") -> bytes:
    type_meta = ld(1, api_version) + ld(2, kind)
    return protobuf.MAGIC + ld(1, type_meta) + ld(2, raw) + ld(3, encoding) + ld(4, "")


def meta(name: str) -> bytes:
    return ld(1, ld(1, name) + ld(8, b""))  # ObjectMeta{name, creationTimestamp: zero Time}


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    unknown = vi(90, 7) + key(91, 1) + b"\x01" * 8 + key(92, 5) + b"\x02" * 4 + ld(93, b"\x08\x01")
    raw = unknown + ld(1, ld(1, "n") + unknown) + unknown
    assert protobuf.decode_body(envelope("v1", "Namespace", raw)) == {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}


def test_scalars_packed_and_unpacked_negative_ints_and_pointer_zeros() -> None:
    sec = (ld(4, varint(1000) + varint(2000)) + vi(4, 3000)  # supplementalGroups, packed + not
           + vi(2, 0) + vi(3, 0))                            # runAsUser 0, runAsNonRoot false
    spec = ld(2, ld(1, "c") + ld(2, "img")) + ld(14, sec) + vi(25, -5)  # priority -5
    pod = protobuf.decode_body(envelope("v1", "Pod", meta("p") + ld(2, spec)))
    assert pod["spec"] == {
        "containers": [{"name": "c", "image": "img"}],
        "securityContext": {"supplementalGroups": [1000, 2000, 3000],
                            "runAsUser": 0, "runAsNonRoot": False},
        "priority": -5,
    }


def test_times_int_or_string_quantities_and_fields_v1() -> None:
    managed = ld(17, ld(1, "kubectl") + ld(4, vi(1, 1_700_000_000) + vi(2, 0))
                 + ld(7, ld(1, b'{"f:data":{".":{}}}')))
    md = ld(1, ld(1, "d") + ld(9, vi(1, 1_700_000_000) + vi(2, 999_999_999)) + managed)
    rolling = ld(1, vi(1, 0) + vi(2, 1) + ld(3, "")) + ld(2, vi(1, 1) + vi(2, 0) + ld(3, "25%"))
    limits = entry(1, "cpu", ld(1, "250m")) + entry(1, "memory", b"")  # an empty Quantity is 0
    container = ld(1, "c") + ld(8, limits)
    template = ld(2, ld(2, container))  # PodSpec.containers
    spec = ld(3, template) + ld(4, ld(1, "RollingUpdate") + ld(2, rolling))
    d = protobuf.decode_body(envelope("apps/v1", "Deployment", md + ld(2, spec)))
    assert d["metadata"] == {
        "name": "d",
        "deletionTimestamp": "2023-11-14T22:13:20Z",  # seconds precision, like JSON
        "managedFields": [{"manager": "kubectl", "time": "2023-11-14T22:13:20Z",
                           "fieldsV1": {"f:data": {".": {}}}}],
    }
    assert d["spec"]["strategy"] == {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"}}
    assert d["spec"]["template"] == {
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "250m",
                                                                        "memory": "0"}}}]}}

    ev = protobuf.decode_body(envelope("events.k8s.io/v1", "Event",
                                       meta("e") + ld(2, vi(1, 1_700_000_000) + vi(2, 123_456_789))
                                       + ld(7, "Started")))
    assert ev == {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
                  "eventTime": "2023-11-14T22:13:20.123456Z", "reason": "Started"}


def test_eviction_and_delete_options() -> None:
    opts = vi(1, 0) + ld(2, ld(1, "uid-1")) + ld(4, "Foreground")
    ev = protobuf.decode_body(envelope("policy/v1", "Eviction", meta("p") + ld(2, opts)))
    assert ev == {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"},
                  "deleteOptions": {"gracePeriodSeconds": 0, "preconditions": {"uid": "uid-1"},
                                    "propagationPolicy": "Foreground"}}


def test_eviction_v1beta1_and_priority_class() -> None:
    ev = protobuf.decode_body(envelope("policy/v1beta1", "Eviction", meta("p")))
    assert ev == {"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "p"}}
    # What `kubectl create priorityclass high --value=1000 --preemption-policy=Never` sends;
    # field numbers from the descriptor of k8s.io/api/scheduling/v1/generated.proto in kubectl 1.32.
    pc = protobuf.decode_body(envelope("scheduling.k8s.io/v1", "PriorityClass",
                                       meta("high") + vi(2, 1000) + vi(3, 0) + ld(4, "")
                                       + ld(5, "Never")))
    assert pc == {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                  "metadata": {"name": "high"}, "value": 1000, "preemptionPolicy": "Never"}



def test_networking_kinds() -> None:
    # What `kubectl create ingress simple --class fleet --rule "foo.com/bar*=svc1:8080,tls=my-cert"`
    # sends (field numbers from k8s.io/api/networking/v1/generated.proto): the rule's
    # IngressRuleValue is an embedded struct JSON inlines, pathType and the class are pointers.
    backend = ld(4, ld(1, "svc1") + ld(2, ld(1, "") + vi(2, 8080)))
    path = ld(1, "/bar") + ld(2, backend) + ld(3, "Prefix")
    rule = ld(1, "foo.com") + ld(2, ld(1, ld(1, path)))
    spec = ld(2, ld(1, "foo.com") + ld(2, "my-cert")) + ld(3, rule) + ld(4, "fleet")
    ing = protobuf.decode_body(envelope("networking.k8s.io/v1", "Ingress",
                                        meta("simple") + ld(2, spec) + ld(3, ld(1, b""))))
    assert ing == {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "simple"},
                   "spec": {"ingressClassName": "fleet", "tls": [{"hosts": ["foo.com"], "secretName": "my-cert"}],
                            "rules": [{"host": "foo.com", "http": {"paths": [
                                {"path": "/bar", "pathType": "Prefix",
                                 "backend": {"service": {"name": "svc1", "port": {"number": 8080}}}}]}}]},
                   "status": {"loadBalancer": {}}}
    params = ld(1, "k8s.example.com") + ld(2, "Params") + ld(3, "p") + ld(4, "Cluster")
    cls = protobuf.decode_body(envelope("networking.k8s.io/v1", "IngressClass",
                                        meta("c") + ld(2, ld(1, "fleet.dev/x") + ld(2, params))))
    assert cls["spec"] == {"controller": "fleet.dev/x", "parameters": {
        "apiGroup": "k8s.example.com", "kind": "Params", "name": "p", "scope": "Cluster"}}
    port = ld(1, "TCP") + ld(2, vi(1, 0) + vi(2, 80)) + vi(3, 90)
    peer = ld(3, ld(1, "10.0.0.0/8") + ld(2, "10.1.0.0/16"))
    np_spec = ld(1, b"") + ld(3, ld(1, port) + ld(2, peer)) + ld(4, "Egress")
    np = protobuf.decode_body(envelope("networking.k8s.io/v1", "NetworkPolicy", meta("n") + ld(2, np_spec)))
    assert np["spec"] == {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
        "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}],
        "to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}]}

# -- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "message"), [
    (b"", "magic"),
    (b'{"kind": "ConfigMap"}', "magic"),
    (protobuf.MAGIC + b"\x0a", "truncated varint"),
    (protobuf.MAGIC + b"\x0a\x05\x0a\x02v1", "past the end"),
    (protobuf.MAGIC + b"\x0b", "wire type 3"),
    (protobuf.MAGIC + b"\x08" + b"\xff" * 11, "varint"),
    (protobuf.MAGIC + b"\x00\x00", "field number 0"),
    (envelope("v1", "ConfigMap", vi(1, 5)), "wire type 0"),           # metadata as a varint
    (envelope("v1", "ConfigMap", meta("x") + ld(2, b"\x0a\x05ab")), "past the end"),
    (envelope("apps/v1", "Deployment", ld(2, ld(1, b"x"))), "wire type 2"),  # replicas as bytes
    (envelope("v1", "Namespace", ld(1, key(1, 1) + b"\x00\x00")), "truncated fixed64"),
    (envelope("v1", "Namespace", ld(1, ld(9, vi(1, 10**15)))), "time out of range"),
    (envelope("v1", "Pod", ld(1, ld(17, ld(7, ld(1, b"{not json"))))), "not JSON"),
])
def test_malformed_bodies_are_bad_requests(body: bytes, message: str) -> None:
    with pytest.raises(errors.BadRequest) as e:
        protobuf.decode_body(body)
    assert e.value.code == 400 and message in e.value.message


def test_unknown_kind_and_encoded_payloads_are_unsupported() -> None:
    with pytest.raises(errors.UnsupportedMediaType) as e:
        protobuf.decode_body(envelope("example.com/v1", "Widget", meta("r")))
    assert e.value.code == 415
    assert "Widget in example.com/v1" in e.value.message and "application/json" in e.value.message
    with pytest.raises(errors.UnsupportedMediaType, match="contentEncoding"):
        protobuf.decode_body(envelope("v1", "ConfigMap", meta("x"), encoding="gzip"))


# -- schema tables --------------------------------------------------------------------------

def test_schema_is_closed_and_acyclic() -> None:
    kinds = {protobuf.STR, protobuf.INT, protobuf.BOOL, protobuf.BYTES, protobuf.MSG,
             protobuf.INTSTR, protobuf.QUANTITY, protobuf.TIME, protobuf.MICROTIME,
             protobuf.FIELDS, protobuf.STRINGS}
    for name, fields in protobuf.SCHEMA.items():
        for num, (json_name, kind, msg, _flags) in fields.items():
            assert num > 0 and json_name and kind in kinds, (name, num)
            assert (kind == protobuf.MSG) == (msg is not None), (name, num)
            assert msg is None or msg in protobuf.SCHEMA, (name, num, msg)
    assert set(protobuf.KINDS.values()) <= set(protobuf.SCHEMA)

    # Acyclic, so decoding recursion is bounded by the schema, not by the input.
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " > ".join((*path, name))
        if name in done:
            return
        for _, _kind, msg, _ in protobuf.SCHEMA[name].values():
            if msg is not None:
                visit(msg, (*path, name))
        done.add(name)

    for name in protobuf.SCHEMA:
        visit(name, ())


def test_field_numbers_match_generated_proto() -> None:
    # Spot checks against kubernetes/api generated.proto and apimachinery's.
    s = protobuf.SCHEMA
    assert s["core.v1.Container"][11] == ("readinessProbe", protobuf.MSG, "core.v1.Probe", 0)
    assert s["core.v1.Container"][7][:2] == ("env", protobuf.MSG)
    assert s["core.v1.ContainerPort"][3][0] == "containerPort"
    assert s["core.v1.ServicePort"][4] == ("targetPort", protobuf.INTSTR, None, 0)
    assert s["apps.v1.DeploymentSpec"][1] == ("replicas", protobuf.INT, None, protobuf.PTR)
    assert s["batch.v1.CronJobSpec"][5][:3] == ("jobTemplate", protobuf.MSG, "batch.v1.JobTemplateSpec")
    assert s["meta.v1.ObjectMeta"][11] == ("labels", protobuf.STR, None, protobuf.MAP)
    assert s["core.v1.Secret"][2] == ("data", protobuf.BYTES, None, protobuf.MAP)


# -- the server's decode path -----------------------------------------------------------------

def test_rest_decode_body_accepts_protobuf() -> None:
    body = CAPTURED[1][1]
    req = Req("POST", "/api/v1/namespaces/demo/configmaps", {},
              {"content-type": "application/vnd.kubernetes.protobuf"}, body)
    assert rest_decode_body(req) == CAPTURED[1][2]
    bad = Req("POST", "/api/v1/namespaces/demo/configmaps", {},
              {"content-type": "application/vnd.kubernetes.protobuf"}, b"not protobuf")
    with pytest.raises(errors.BadRequest):
        rest_decode_body(bad)


def test_certificate_signing_request_as_kubectl_certificate_approve_sends_it() -> None:
    spec = (ld(1, b"-----BEGIN CERTIFICATE REQUEST-----") + ld(2, "alice") + ld(4, "dev") + ld(4, "ops")
            + ld(5, "client auth") + entry(6, "scopes", ld(1, "a") + ld(1, "b"))
            + ld(7, "kubernetes.io/kube-apiserver-client") + vi(8, 3600))
    cond = ld(1, "Approved") + ld(6, "True") + ld(2, "KubectlApprove") + ld(3, "ok") + ld(4, vi(1, 1_700_000_000))
    raw = meta("csr-1") + ld(2, spec) + ld(3, ld(1, cond))
    got = protobuf.decode_body(envelope("certificates.k8s.io/v1", "CertificateSigningRequest", raw))
    assert got == {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "csr-1"},
        "spec": {"request": base64.b64encode(b"-----BEGIN CERTIFICATE REQUEST-----").decode(),
                 "username": "alice", "groups": ["dev", "ops"], "usages": ["client auth"],
                 "extra": {"scopes": ["a", "b"]}, "signerName": "kubernetes.io/kube-apiserver-client",
                 "expirationSeconds": 3600},
        "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove",
                                   "message": "ok", "lastUpdateTime": "2023-11-14T22:13:20Z"}]},
    }
