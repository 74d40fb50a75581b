"""metadata.managedFields encoding and the FieldManager every write goes through."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest

from fleet.api import errors
from fleet.api.ssa import managedfields as mf
from fleet.api.ssa import schema as sch
from fleet.api.ssa.fieldpath import FieldSet, make_path

T0 = dt.datetime(2026, 1, 1, 0, 0, 0, tzinfo=dt.UTC)
T1 = dt.datetime(2026, 1, 1, 0, 5, 0, tzinfo=dt.UTC)
T2 = dt.datetime(2026, 1, 1, 0, 9, 0, tzinfo=dt.UTC)


def fm() -> mf.FieldManager:
    return mf.FieldManager(sch.for_kind("apps", "v1", "Deployment"), "apps/v1", "Deployment")


def deployment(replicas: int = 1, image: str = "nginx", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", **meta},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": image}]}}},
    }


def stored(obj: dict[str, Any], uid: str = "u1", rv: str = "1") -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].update(uid=uid, resourceVersion=rv, creationTimestamp="2026-01-01T00:00:00Z", generation=1)
    return out


def entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["metadata"].get("managedFields", [])


def test_create_records_an_update_entry_without_identity_fields() -> None:
    obj = fm().update(None, stored(deployment()), "kubectl-client-side-apply", now=T0)
    [e] = entries(obj)
    assert {k: e[k] for k in ("manager", "operation", "apiVersion", "time", "fieldsType")} == {
        "manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "apps/v1",
        "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1"}
    fields = e["fieldsV1"]
    assert "." not in fields["f:spec"]  # a struct that is always there is not owned as a whole
    assert "f:apiVersion" not in fields and "f:kind" not in fields
    assert "f:metadata" not in fields  # name, namespace, uid, ... are nobody's
    assert fields["f:spec"]["f:replicas"] == {}
    assert fields["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"c"}'] == \
        {".": {}, "f:image": {}, "f:name": {}}


def test_apply_conflict_message_and_status_match_kube() -> None:
    live = fm().update(None, stored(deployment(replicas=1)), "kubectl-client-side-apply", now=T0)
    with pytest.raises(errors.Conflict) as e:
        fm().apply(live, deployment(replicas=3), "helm", now=T1)
    assert e.value.message == ('Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" '
                               "using apps/v1: .spec.replicas")
    status = e.value.status()
    assert (status["code"], status["reason"]) == (409, "Conflict")
    assert status["details"]["causes"] == [{"reason": "FieldManagerConflict", "field": ".spec.replicas",
                                           "message": 'conflict with "kubectl-client-side-apply" using apps/v1'}]


def test_several_conflicts_are_listed_per_manager() -> None:
    live = fm().update(None, stored(deployment()), "kubectl-client-side-apply", now=T0)
    live = fm().apply(live, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                             "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}}},
                      "argo", now=T1)
    with pytest.raises(errors.Conflict) as e:
        fm().apply(live, deployment(replicas=3, image="httpd"), "helm", now=T2)
    assert e.value.message == (
        "Apply failed with 3 conflicts: "
        'conflicts with "argo":\n'
        '- .spec.template.spec.containers[name="c"].image\n'
        'conflicts with "kubectl-client-side-apply" using apps/v1:\n'
        "- .spec.replicas\n"
        '- .spec.template.spec.containers[name="c"].image')


def test_force_takes_ownership() -> None:
    live = fm().update(None, stored(deployment(replicas=1)), "kubectl-client-side-apply", now=T0)
    out = fm().apply(live, deployment(replicas=3), "helm", force=True, now=T1)
    assert out["spec"]["replicas"] == 3
    by = {e["manager"]: e for e in entries(out)}
    assert by["helm"]["operation"] == "Apply" and by["helm"]["time"] == "2026-01-01T00:05:00Z"
    assert "f:replicas" in by["helm"]["fieldsV1"]["f:spec"]
    assert "f:replicas" not in by["kubectl-client-side-apply"]["fieldsV1"]["f:spec"]
    assert "apiVersion" in by["helm"] and "subresource" not in by["helm"]


def test_apply_on_create_and_reapply_is_a_no_op() -> None:
    created = fm().apply(None, deployment(), "helm", now=T0)
    assert [e["manager"] for e in entries(created)] == ["helm"]
    live = stored(created)
    again = fm().apply(live, deployment(), "helm", now=T1)
    assert again == live  # same object, same managedFields (time not bumped)


def test_removing_a_field_by_omitting_it() -> None:
    cfg = deployment()
    cfg["metadata"]["labels"] = {"team": "a", "tier": "web"}
    live = stored(fm().apply(None, cfg, "helm", now=T0))
    cfg2 = copy.deepcopy(cfg)
    del cfg2["metadata"]["labels"]["tier"]
    out = fm().apply(live, cfg2, "helm", now=T1)
    assert out["metadata"]["labels"] == {"team": "a"}


def test_object_without_managed_fields_gets_before_first_apply() -> None:
    live = stored(deployment(replicas=1))  # written before field tracking
    with pytest.raises(errors.Conflict) as e:
        fm().apply(live, deployment(replicas=2), "helm", now=T1)
    assert e.value.message == ('Apply failed with 1 conflict: conflict with "before-first-apply" '
                               "using apps/v1: .spec.replicas")
    out = fm().apply(live, deployment(replicas=1), "helm", now=T1)
    assert {e["manager"] for e in entries(out)} == {"before-first-apply", "helm"}


def test_update_of_untracked_object_stays_untracked() -> None:
    live = stored(deployment(replicas=1))
    out = fm().update(live, stored(deployment(replicas=2)), "kubectl-edit", now=T1)
    assert "managedFields" not in out["metadata"]


def test_no_op_update_keeps_managed_fields_and_time() -> None:
    live = stored(fm().update(None, stored(deployment()), "ctl", now=T0))
    new = copy.deepcopy(live)
    new["metadata"]["resourceVersion"] = "2"  # identity fields are nobody's: still a no-op
    out = fm().update(live, new, "ctl", now=T1)
    assert entries(out) == entries(live)


def test_update_moves_changed_fields_and_bumps_time() -> None:
    live = stored(fm().apply(None, deployment(replicas=1), "helm", now=T0))
    out = fm().update(live, stored(deployment(replicas=5)), "kube-controller-manager", now=T1)
    by = {e["manager"]: e for e in entries(out)}
    assert by["kube-controller-manager"]["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    assert by["kube-controller-manager"]["time"] == "2026-01-01T00:05:00Z"
    assert "f:replicas" not in by["helm"]["fieldsV1"]["f:spec"]
    assert by["helm"]["time"] == "2026-01-01T00:00:00Z"


def test_client_supplied_managed_fields_win_and_garbage_is_ignored() -> None:
    live = stored(fm().apply(None, deployment(), "helm", now=T0))
    new = copy.deepcopy(live)
    new["metadata"]["managedFields"] = [{"manager": "me", "operation": "Update", "apiVersion": "apps/v1",
                                         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:paused": {}}}}]
    out = fm().update(live, new, "ctl", now=T1)
    assert [e["manager"] for e in entries(out)] == ["me"]
    bad = copy.deepcopy(live)
    bad["metadata"]["managedFields"] = [{"manager": "me", "operation": "Bogus"}]
    out = fm().update(live, bad, "ctl", now=T1)
    assert entries(out) == entries(live)


@pytest.mark.parametrize("reset", [[], [{}]])
def test_reset_request_clears_managed_fields(reset: list) -> None:
    live = stored(fm().apply(None, deployment(), "helm", now=T0))
    new = copy.deepcopy(live)
    new["metadata"]["managedFields"] = reset
    out = fm().update(live, new, "ctl", now=T1)
    assert "managedFields" not in out["metadata"]
    # On create a reset just means "start from nothing": the creator is tracked.
    created = fm().update(None, {**deployment(), "metadata": {"name": "web", "managedFields": reset}}, "ctl")
    assert [e["manager"] for e in entries(created)] == ["ctl"]


def test_undecodable_live_managed_fields_do_not_block_writes() -> None:
    live = stored(deployment())
    live["metadata"]["managedFields"] = [{"manager": "x", "operation": "Bogus"}]
    out = fm().update(live, stored(deployment(replicas=2)), "ctl", now=T1)
    assert out["spec"]["replicas"] == 2 and "managedFields" not in out["metadata"]
    with pytest.raises(mf.ManagedFieldsError) as e:
        fm().apply(live, deployment(replicas=3), "helm")
    assert str(e.value) == "failed to decode managed fields: operation must be `Apply` or `Update`"


def test_update_managers_are_capped_into_ancient_changes() -> None:
    live = stored(fm().update(None, stored(deployment()), "creator", now=T0))
    for i in range(12):
        new = copy.deepcopy(live)
        new["metadata"].setdefault("labels", {})[f"l{i}"] = "x"
        live = fm().update(live, new, f"writer-{i}", now=T0 + dt.timedelta(minutes=i + 1))
    managers = [e["manager"] for e in entries(live)]
    assert len(managers) == 10
    assert "ancient-changes" in managers and "creator" not in managers and "writer-11" in managers
    ancient = next(e for e in entries(live) if e["manager"] == "ancient-changes")
    # Each update over the cap folds the oldest one in: creator, then writer-0, -1 and -2.
    assert set(ancient["fieldsV1"]["f:metadata"]["f:labels"]) == {".", "f:l0", "f:l1", "f:l2"}
    assert "f:spec" in ancient["fieldsV1"]  # the creator's fields went into the bucket


def test_kubectl_server_side_apply_upgrades_from_client_side_apply() -> None:
    cfg = deployment(replicas=1)
    last = json.dumps(cfg)
    created = stored(cfg, uid="u1")
    created["metadata"]["annotations"] = {mf.LAST_APPLIED: last}
    live = fm().update(None, created, "kubectl-client-side-apply", now=T0)
    # Fields still at their last-applied value are not conflicts for the manager "kubectl".
    out = fm().apply(live, deployment(replicas=4), "kubectl", now=T1)
    assert out["spec"]["replicas"] == 4
    assert json.loads(out["metadata"]["annotations"][mf.LAST_APPLIED])["spec"]["replicas"] == 4
    # Another applier name gets the conflict.
    with pytest.raises(errors.Conflict):
        fm().apply(live, deployment(replicas=4), "kubectl-ssa", now=T1)


def test_kubectl_still_conflicts_on_fields_changed_since_last_apply() -> None:
    cfg = deployment(replicas=1)
    created = stored(cfg)
    created["metadata"]["annotations"] = {mf.LAST_APPLIED: json.dumps(cfg)}
    live = stored(fm().update(None, created, "kubectl-client-side-apply", now=T0))
    live = fm().update(live, {**copy.deepcopy(live), "spec": {**live["spec"], "replicas": 7}}, "hpa", now=T1)
    with pytest.raises(errors.Conflict) as e:
        fm().apply(live, deployment(replicas=4), "kubectl", now=T2)
    assert e.value.message == 'Apply failed with 1 conflict: conflict with "hpa" using apps/v1: .spec.replicas'


@pytest.mark.parametrize(("config", "message"), [
    ({"apiVersion": "apps/v1", "kind": "ReplicaSet"}, "invalid object type: apps/v1, Kind=ReplicaSet"),
    ({"apiVersion": "v1", "kind": "Pod"}, "invalid object type: /v1, Kind=Pod"),
    ({"kind": "Deployment"}, "invalid object type: /, Kind=Deployment"),
    ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"managedFields": []}},
     "metadata.managedFields must be nil"),
])
def test_bad_apply_configurations(config: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.BadRequest) as e:
        fm().apply(None, config, "helm")
    assert e.value.message == message


def test_subresource_managers() -> None:
    status_fm = mf.FieldManager(sch.for_kind("apps", "v1", "Deployment"), "apps/v1", "Deployment",
                                subresource="status", ignored=[])
    live = stored(fm().apply(None, deployment(), "helm", now=T0))
    new = copy.deepcopy(live)
    new["status"] = {"replicas": 1}
    out = status_fm.update(live, new, "kube-controller-manager", now=T1)
    e = next(x for x in entries(out) if x["manager"] == "kube-controller-manager")
    assert e["subresource"] == "status" and e["fieldsV1"] == {"f:status": {"f:replicas": {}}}
    ident = mf.manager_identifier("kube-controller-manager", "Update", "apps/v1", "status")
    assert mf.print_manager(ident) == '"kube-controller-manager" with subresource "status" using apps/v1'


def test_identifiers() -> None:
    assert mf.manager_identifier("helm", "Apply", "apps/v1") == '{"manager":"helm","operation":"Apply"}'
    assert mf.manager_identifier("k", "Update", "v1") == '{"manager":"k","operation":"Update","apiVersion":"v1"}'
    assert mf.print_manager(mf.manager_identifier("helm", "Apply", "apps/v1")) == '"helm"'
    assert mf.print_manager("not json") == '"not json"'


def test_decode_encode_round_trip_and_merge_of_same_identifier() -> None:
    raw = [
        {"manager": "b", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:02Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}},
        {"manager": "a", "operation": "Apply", "apiVersion": "v1", "time": "2026-01-01T00:00:09Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:y": {}}}},
        {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:z": {}}}},
        {"manager": "gone", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}},
    ]
    m = mf.decode(raw)
    assert len(m.fields) == 4
    out = mf.encode(m)
    # Sorted by operation, then time, manager, apiVersion; empty sets dropped.
    assert [(e["manager"], e["operation"]) for e in out] == [("a", "Apply"), ("a", "Update"), ("b", "Update")]
    assert out[0] == raw[1] and out[1] == raw[2] and out[2] == raw[0]
    assert mf.decode(out).fields.keys() == {k for k, v in m.fields.items() if not v.set.empty()}


@pytest.mark.parametrize(("raw", "message"), [
    ([{"operation": "Nope", "apiVersion": "v1", "fieldsType": "FieldsV1"}], "operation must be `Apply` or `Update`"),
    ([{"operation": "Apply", "fieldsType": "FieldsV1"}], "apiVersion must not be empty"),
    ([{"operation": "Apply", "apiVersion": "v1"}], "missing fieldsType in managed fields entry 0"),
    ([{"operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV2"}],
     'invalid fieldsType "FieldsV2" in managed fields entry 0'),
    ([{"operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"q:1": {}}}],
     "error decoding versioned set from entry 0: error decoding set: unknown path element type"),
    ("x", "managedFields must be a list"),
])
def test_decode_errors(raw: Any, message: str) -> None:
    with pytest.raises(mf.ManagedFieldsError) as e:
        mf.decode(raw)
    assert str(e.value) == message


def test_validate_causes() -> None:
    causes = mf.validate([
        {"manager": "ok", "operation": "Apply", "fieldsType": "FieldsV1", "time": "2026-01-01T00:00:00Z"},
        {"manager": "x" * 129, "operation": "Patch", "fieldsType": "FieldsV2", "time": "yesterday"},
        {"manager": "bad\x01", "operation": "Update", "fieldsV1": {"q:1": {}}},
    ])
    assert [c["field"] for c in causes] == [
        "metadata.managedFields[1].operation", "metadata.managedFields[1].fieldsType",
        "metadata.managedFields[1].manager", "metadata.managedFields[1].time",
        "metadata.managedFields[2].manager", "metadata.managedFields[2].fieldsV1"]
    assert causes[0]["message"] == 'Invalid value: "Patch": must be `Apply` or `Update`'
    assert causes[4]["message"] == 'Invalid value: "bad\\u0001": invalid character U+0001 (at position 3)'


def test_stripped_paths() -> None:
    assert mf.STRIPPED.has(make_path("metadata", "resourceVersion"))
    assert not mf.STRIPPED.has(make_path("metadata", "labels"))
    assert isinstance(mf.STRIPPED, FieldSet)


def pod(containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}}


def test_pod_containers_owned_per_item_by_two_appliers() -> None:
    pfm = mf.FieldManager(sch.for_kind("", "v1", "Pod"), "v1", "Pod")
    app = {"name": "app", "image": "app:1", "ports": [{"containerPort": 80}],
           "env": [{"name": "A", "value": "1"}]}
    live = stored(pfm.apply(None, pod([app]), "deployer", now=T0))
    sidecar = {"name": "proxy", "image": "envoy"}
    live = stored(pfm.apply(live, pod([sidecar]), "injector", now=T1))
    # Nothing shared: the config's items come first (structured-merge-diff's order).
    assert [c["name"] for c in live["spec"]["containers"]] == ["proxy", "app"]
    # The deployer re-applies without the sidecar and without env A: the sidecar stays
    # (the injector owns it), env A goes (only the deployer owned it).
    app2 = {k: v for k, v in app.items() if k != "env"}
    out = pfm.apply(live, pod([app2]), "deployer", now=T2)
    assert [c["name"] for c in out["spec"]["containers"]] == ["proxy", "app"]
    assert "env" not in out["spec"]["containers"][0]
    by = {e["manager"]: e["fieldsV1"] for e in entries(out)}
    port_key = 'k:{"containerPort":80,"protocol":"TCP"}'  # protocol filled in from its default
    assert port_key in by["deployer"]["f:spec"]["f:containers"]['k:{"name":"app"}']["f:ports"]
    assert list(by["injector"]["f:spec"]["f:containers"]) == ['k:{"name":"proxy"}']
    # Changing the sidecar's image is the injector's business.
    with pytest.raises(errors.Conflict) as e:
        pfm.apply(stored(out), pod([app2, {"name": "proxy", "image": "envoy:2"}]), "deployer", now=T2)
    assert e.value.message == ('Apply failed with 1 conflict: conflict with "injector": '
                               '.spec.containers[name="proxy"].image')


def test_custom_resource_from_openapi_schema() -> None:
    t = sch.from_openapi({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "size": {"type": "integer"},
        "members": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"],
                    "items": {"type": "object", "properties": {"id": {"type": "string"},
                                                               "weight": {"type": "integer"}}}}}}}})
    cfm = mf.FieldManager(t, "example.com/v1", "Cluster")
    cr = {"apiVersion": "example.com/v1", "kind": "Cluster", "metadata": {"name": "c1"},
          "spec": {"size": 3, "members": [{"id": "a", "weight": 1}]}}
    live = stored(cfm.apply(None, cr, "operator", now=T0))
    [e] = entries(live)
    assert e["apiVersion"] == "example.com/v1"
    # An Apply entry is the config's field set: `.spec` itself is not in it.
    assert e["fieldsV1"] == {"f:spec": {"f:size": {}, "f:members": {
        'k:{"id":"a"}': {".": {}, "f:id": {}, "f:weight": {}}}}}
    # An Update that adds a CR struct (no Go zero value behind it) owns it whole, as in kube.
    created = cfm.update(None, stored(cr), "kubectl-create", now=T0)
    assert entries(created)[0]["fieldsV1"]["f:spec"]["."] == {}
    live = stored(cfm.update(live, {**copy.deepcopy(live), "spec": {**live["spec"], "size": 5}}, "kubectl-edit",
                             now=T1))
    with pytest.raises(errors.Conflict) as err:
        cfm.apply(live, {**cr, "spec": {"size": 4, "members": [{"id": "a", "weight": 1}]}}, "operator")
    assert err.value.message.endswith('conflict with "kubectl-edit" using example.com/v1: .spec.size')


def test_duplicate_entries_for_one_identifier_are_united() -> None:
    raw = [
        {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:05Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}},
        {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:y": {}}}},
    ]
    [e] = mf.encode(mf.decode(raw))
    assert e["fieldsV1"] == {"f:data": {"f:x": {}, "f:y": {}}}
    assert e["time"] == "2026-01-01T00:00:05Z"


def test_capping_never_loses_fields() -> None:
    f = mf.FieldManager(sch.for_kind("", "v1", "ConfigMap"), "v1", "ConfigMap", max_update_managers=2)
    live = stored(f.update(None, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                                  "data": {"seed": "x"}}, "creator", now=T0))
    for i in range(6):
        new = copy.deepcopy(live)
        new["data"][f"k{i}"] = "v"
        live = stored(f.update(live, new, f"w{i}", now=T0 + dt.timedelta(minutes=i + 1)))
        owned = set()
        for e in entries(live):
            owned |= set(e["fieldsV1"].get("f:data", {}))
        assert {f"f:k{j}" for j in range(i + 1)} <= owned  # nothing is ever lost by capping
        assert len(entries(live)) <= 2


def test_capping_keeps_an_ancient_bucket_newer_than_another_updater() -> None:
    # Times a client wrote can put the bucket after an unmerged updater; kube would fold the
    # bucket into itself there and drop it.  Its fields must survive.
    def entry(manager: str, minute: int, key: str) -> dict[str, Any]:
        return {"manager": manager, "operation": "Update", "apiVersion": "v1",
                "time": f"2026-01-01T00:0{minute}:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {f"f:{key}": {}}}}

    managed = mf.decode([entry("a", 1, "a"), entry("ancient-changes", 3, "old"), entry("b", 4, "b"),
                         entry("c", 5, "c")])
    f = mf.FieldManager(sch.for_kind("", "v1", "ConfigMap"), "v1", "ConfigMap", max_update_managers=2)
    out = mf.encode(f._cap(managed))
    by = {e["manager"]: set(e["fieldsV1"]["f:data"]) for e in out}
    assert by == {"a": {"f:a"}, "ancient-changes": {"f:old", "f:b", "f:c"}}


def test_package_level_apply_returns_object_or_conflicts() -> None:
    from fleet.api import ssa

    t = sch.for_kind("apps", "v1", "Deployment")
    obj, managed = ssa.apply(None, "helm", None, deployment(replicas=2), t=t, api_version="apps/v1",
                             kind="Deployment")
    assert obj["spec"]["replicas"] == 2 and [e["manager"] for e in managed] == ["helm"]
    out = ssa.apply(managed, "argo", stored(obj), deployment(replicas=5), t=t, api_version="apps/v1",
                    kind="Deployment")
    assert isinstance(out, ssa.Conflicts)
    assert [(c.manager, ssa.path_string(c.path)) for c in out.conflicts] == \
        [('{"manager":"helm","operation":"Apply"}', ".spec.replicas")]
    obj2, managed2 = ssa.apply(managed, "argo", stored(obj), deployment(replicas=5), t=t,
                               api_version="apps/v1", kind="Deployment", force=True)
    assert obj2["spec"]["replicas"] == 5 and {e["manager"] for e in managed2} == {"helm", "argo"}
