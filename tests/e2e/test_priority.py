"""PriorityClasses, pod priority and scheduling-field validation with kubectl 1.32 against a
real `fleet server`.

PriorityClasses are cluster-scoped, so the tests here use class names of their own
and the one test that makes a class the global default runs on a server of its own.
Results are checked through the API as well as through kubectl's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KUBECTL, FleetServer, run_kubectl
from tests.e2e.helpers import api_get, dump_all

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")]

PCS = "/apis/scheduling.k8s.io/v1/priorityclasses"


def ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, f"kubectl failed rc={rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def fails(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc != 0, f"kubectl should have failed\nstdout:\n{out}\nstderr:\n{err}"
    return err


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}], **spec}}


def write(tmp_path: Path, *docs: dict[str, Any], name: str = "m.yaml") -> str:
    p = tmp_path / name
    p.write_text(dump_all(*docs))
    return str(p)


def test_priority_class_crud(fleet_server: FleetServer, kubectl, tmp_path: Path) -> None:
    # Built-ins first, printed with kubectl's columns.
    out = ok(kubectl("get", "priorityclasses"))
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert rows["system-cluster-critical"][1:3] == ["2000000000", "false"]
    assert rows["system-node-critical"][1:3] == ["2000001000", "false"]
    assert rows["system-node-critical"][-1] == "PreemptLowerPriority"

    # Imperative create (a protobuf body) and apply; `pc` is the short name.
    assert ok(kubectl("create", "priorityclass", "crud-high", "--value=1000", "--description=important",
                      "--preemption-policy=Never")).strip() == "priorityclass.scheduling.k8s.io/crud-high created"
    path = write(tmp_path, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": "crud-low"}, "value": -10})
    assert "priorityclass.scheduling.k8s.io/crud-low created" in ok(kubectl("apply", "-f", path))
    code, got = api_get(fleet_server, f"{PCS}/crud-high")
    assert code == 200
    assert (got["value"], got["description"], got["preemptionPolicy"]) == (1000, "important", "Never")
    assert "globalDefault" not in got
    code, got = api_get(fleet_server, f"{PCS}/crud-low")
    assert (got["value"], got["preemptionPolicy"]) == (-10, "PreemptLowerPriority")
    out = ok(kubectl("get", "pc", "crud-high", "crud-low", "--no-headers"))
    assert [ln.split()[:3] for ln in out.splitlines()] == [["crud-high", "1000", "false"],
                                                           ["crud-low", "-10", "false"]]

    # value is immutable; the description is not.
    err = fails(kubectl("patch", "pc", "crud-high", "--type=merge", "-p", '{"value": 5}'))
    assert 'The PriorityClass "crud-high" is invalid: value: Forbidden: may not be changed in an update.' in err
    ok(kubectl("patch", "pc", "crud-high", "--type=merge", "-p", '{"description": "still important"}'))
    assert api_get(fleet_server, f"{PCS}/crud-high")[1]["description"] == "still important"

    # Reserved names and values.
    err = fails(kubectl("create", "priorityclass", "system-mine", "--value=1"))
    assert "priority class names with 'system-' prefix are reserved for system use only" in err
    err = fails(kubectl("create", "priorityclass", "crud-huge", "--value=1000000001"))
    assert "maximum allowed value of a user defined priority is 1000000000" in err
    err = fails(kubectl("delete", "pc", "system-cluster-critical"))
    assert ('Error from server (Forbidden): priorityclasses.scheduling.k8s.io "system-cluster-critical" is '
            "forbidden: this is a system priority class and cannot be deleted") in err

    assert 'priorityclass.scheduling.k8s.io "crud-low" deleted' in ok(kubectl("delete", "pc", "crud-low"))
    assert api_get(fleet_server, f"{PCS}/crud-low")[0] == 404

    # kubectl explain reads the schema from /openapi/v3.
    assert "FIELD: value <integer>" in ok(kubectl("explain", "priorityclass.value"))


def test_pod_priority_is_resolved_at_admission(fleet_server: FleetServer, kubectl, namespace: str,
                                               tmp_path: Path) -> None:
    ok(kubectl("create", "priorityclass", "resolve-high", "--value=500", "--preemption-policy=Never"))
    path = write(tmp_path, pod("classy", priorityClassName="resolve-high"), pod("plain"),
                 pod("critical", priorityClassName="system-node-critical"))
    ok(kubectl("apply", "-n", namespace, "-f", path))

    def spec_of(name: str) -> dict[str, Any]:
        code, body = api_get(fleet_server, f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert code == 200, body
        return body["spec"]

    assert (spec_of("classy")["priority"], spec_of("classy")["preemptionPolicy"]) == (500, "Never")
    assert (spec_of("plain")["priority"], spec_of("plain")["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert spec_of("critical")["priority"] == 2000001000
    out = ok(kubectl("get", "pod", "classy", "-n", namespace, "-o", "jsonpath={.spec.priority}"))
    assert out == "500"

    # Every pod also got the default NoExecute tolerations (DefaultTolerationSeconds).
    tols = {(t["key"], t.get("tolerationSeconds")) for t in spec_of("plain")["tolerations"]}
    assert tols == {("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300)}

    # Re-applying the same manifest is not a priority change.
    assert "pod/classy unchanged" in ok(kubectl("apply", "-n", namespace, "-f", path))

    # Unknown class, or a priority the class does not give: 403 with Kubernetes' words.
    err = fails(kubectl("run", "lost", "-n", namespace, "--image=busybox",
                        "--overrides", '{"spec": {"priorityClassName": "no-such-class"}}'))
    assert 'pods "lost" is forbidden: no PriorityClass with name no-such-class was found' in err
    bad = write(tmp_path, pod("greedy", priorityClassName="resolve-high", priority=9), name="greedy.yaml")
    err = fails(kubectl("apply", "-n", namespace, "-f", bad))
    assert ("the integer value of priority (9) must not be provided in pod spec; priority admission "
            "controller computed 500 from the given PriorityClass name") in err


def test_malformed_scheduling_fields_are_422(fleet_server: FleetServer, kubectl, namespace: str,
                                             tmp_path: Path) -> None:
    bad = pod("bad",
              affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                  {"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}]},
                  "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                      {"labelSelector": {"matchLabels": {"app": "web"}}}]}},
              tolerations=[{"key": "k", "operator": "Exists", "value": "v"},
                           {"key": "k2", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}],
              topologySpreadConstraints=[{"maxSkew": 0, "topologyKey": "zone",
                                          "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}])
    err = fails(kubectl("apply", "-n", namespace, "-f", write(tmp_path, bad)))
    assert 'The Pod "bad" is invalid:' in err
    na = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
    for line in (
        f"{na}.weight: Invalid value: 0: must be in the range 1-100",
        f"{na}.preference.matchExpressions[0].values: Required value: must be specified when `operator` is "
        "'In' or 'NotIn'",
        "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: "
        "Required value: can not be empty",
        'spec.tolerations[0].operator: Invalid value: core.Toleration{Key:"k", Operator:"Exists", Value:"v", '
        "Effect:\"\", TolerationSeconds:(*int64)(nil)}: value must be empty when `operator` is 'Exists'",
        "spec.tolerations[1].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when "
        "`tolerationSeconds` is set",
        "spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0: must be greater than zero",
        "spec.topologySpreadConstraints[0].minDomains: Invalid value: 2: can only use minDomains if "
        "whenUnsatisfiable=DoNotSchedule, not ScheduleAnyway",
    ):
        assert f"* {line}" in err, (line, err)
    assert api_get(fleet_server, f"/api/v1/namespaces/{namespace}/pods/bad")[0] == 404

    # The same rules hold for pod templates.
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                          "tolerations": [{"operator": "Equal", "value": "x"}]}}}}
    err = fails(kubectl("apply", "-n", namespace, "-f", write(tmp_path, dep, name="dep.yaml")))
    assert "spec.template.spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists " \
           "when `key` is empty" in err


def test_global_default_class(fleet_server_factory) -> None:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    srv = fleet_server_factory.start()

    def kubectl(*args: str) -> tuple[int, str, str]:
        return run_kubectl(srv, *args)

    ok(kubectl("create", "priorityclass", "everyone", "--value=7", "--global-default"))
    err = fails(kubectl("create", "priorityclass", "another", "--value=8", "--global-default"))
    assert ('priorityclasses.scheduling.k8s.io "another" is forbidden: PriorityClass everyone is already '
            "marked as default. Only one default can exist") in err
    out = ok(kubectl("get", "pc", "everyone", "--no-headers"))
    assert out.split()[:3] == ["everyone", "7", "true"]
    ok(kubectl("run", "p", "--image=busybox"))
    code, body = api_get(srv, "/api/v1/namespaces/default/pods/p")
    assert (body["spec"]["priority"], body["spec"]["priorityClassName"]) == (7, "everyone")
