"""PodTemplate and ReplicationController (core/v1): defaults, validation and table cells,
as kube-apiserver and kubectl's printers have them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.replication import (
    POD_TEMPLATE,
    REPLICATION_CONTROLLER,
    default_replication_controller,
    validate_pod_template_kind,
    validate_replication_controller,
)
from fleet.api.registry import default_registry


def fields(causes: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in causes]


def template(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"spec": {"containers": [{"name": "c", "image": "nginx"}], **spec}}
    if labels is not None:
        t["metadata"] = {"labels": labels}
    return t


def rc(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ReplicationController",
            "metadata": {"name": "web", "namespace": "default"}, "spec": spec}


def defaulted(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    default_replication_controller(obj)
    return obj


# ---------------------------------------------------------------------------
# ReplicationController


def test_defaults_selector_labels_and_replicas_from_the_template():
    obj = defaulted(rc(template=template({"app": "web"})))
    assert obj["spec"]["selector"] == {"app": "web"}
    assert obj["metadata"]["labels"] == {"app": "web"}
    assert obj["spec"]["replicas"] == 1
    tspec = obj["spec"]["template"]["spec"]
    assert tspec["restartPolicy"] == "Always" and tspec["dnsPolicy"] == "ClusterFirst"
    assert validate_replication_controller(obj, None) == []


def test_defaults_keep_what_is_given():
    obj = rc(template=template({"app": "web", "v": "1"}), selector={"app": "web"}, replicas=0)
    obj["metadata"]["labels"] = {"team": "a"}
    obj = defaulted(obj)
    assert obj["spec"]["selector"] == {"app": "web"}
    assert obj["metadata"]["labels"] == {"team": "a"}
    assert obj["spec"]["replicas"] == 0


@pytest.mark.parametrize(("spec", "want"), [
    # No labels anywhere: nothing to default the selector from.
    ({"template": template()}, [("spec.selector", "Required value")]),
    ({"selector": {"app": "x"}, "template": template({"app": "web"})},
     [("spec.template.metadata.labels",
       'Invalid value: {"app":"web"}: `selector` does not match template `labels`')]),
    ({"selector": {"app": "web"}, "replicas": -1, "minReadySeconds": -2, "template": template({"app": "web"})},
     [("spec.minReadySeconds", "Invalid value: -2: must be greater than or equal to 0"),
      ("spec.replicas", "Invalid value: -1: must be greater than or equal to 0")]),
    ({"selector": {"app": "web"}}, [("spec.template", "Required value")]),
    ({"selector": {"app": "web"}, "template": template({"app": "web"}, restartPolicy="OnFailure")},
     [("spec.template.spec.restartPolicy", 'Unsupported value: "OnFailure": supported values: "Always"')]),
    ({"selector": {"app": "web"}, "template": template({"app": "web"}, activeDeadlineSeconds=5)},
     [("spec.template.spec.activeDeadlineSeconds",
       "Forbidden: activeDeadlineSeconds in ReplicationController is not Supported")]),
    ({"selector": {"app": 1}, "template": template({"app": "web"})},
     [("spec.selector.app", "Invalid value: 1: must be of type string")]),
])
def test_validation(spec, want):
    got = fields(validate_replication_controller(defaulted(rc(**spec)), None))
    for w in want:
        assert w in got, got
    assert len(got) == len(want), got


def test_selector_is_mutable_but_must_keep_matching():
    old = defaulted(rc(template=template({"app": "web", "v": "1"}), selector={"app": "web"}))
    new = copy.deepcopy(old)
    new["spec"]["selector"] = {"app": "web", "v": "1"}
    assert validate_replication_controller(new, old) == []  # apps/v1 kinds refuse this; RCs do not
    new["spec"]["selector"] = {"v": "2"}
    assert ("spec.template.metadata.labels",
            'Invalid value: {"app":"web","v":"1"}: `selector` does not match template `labels`') \
        in fields(validate_replication_controller(new, old))


def test_status_is_checked_as_kube_does():
    obj = defaulted(rc(template=template({"app": "web"})))
    obj["status"] = {"replicas": 2, "fullyLabeledReplicas": 3, "readyReplicas": 1, "availableReplicas": 2,
                     "observedGeneration": -1}
    assert fields(validate_replication_controller(obj, None)) == [
        ("status.observedGeneration", "Invalid value: -1: must be greater than or equal to 0"),
        ("status.fullyLabeledReplicas", "Invalid value: 3: cannot be greater than status.replicas"),
        ("status.availableReplicas", "Invalid value: 2: cannot be greater than readyReplicas"),
    ]
    obj["status"] = {"replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 2, "availableReplicas": 1,
                     "observedGeneration": 1}
    assert validate_replication_controller(obj, None) == []


def rc_cells(obj: dict[str, Any]) -> dict[str, Any]:
    return {c.name: c.value(obj) for c in REPLICATION_CONTROLLER.table_columns()}


def test_rc_table():
    cols = REPLICATION_CONTROLLER.table_columns()
    assert [(c.name, c.priority) for c in cols] == [
        ("Name", 0), ("Desired", 0), ("Current", 0), ("Ready", 0), ("Age", 0),
        ("Containers", 1), ("Images", 1), ("Selector", 1)]
    obj = defaulted(rc(replicas=3, template={"metadata": {"labels": {"app": "web", "a": "b"}}, "spec": {
        "containers": [{"name": "c", "image": "nginx"}, {"name": "s", "image": "busybox"}]}}))
    obj["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    obj["status"] = {"replicas": 2, "readyReplicas": 1}
    cells = rc_cells(obj)
    assert (cells["Desired"], cells["Current"], cells["Ready"]) == (3, 2, 1)
    assert (cells["Containers"], cells["Images"], cells["Selector"]) == ("c,s", "nginx,busybox", "a=b,app=web")
    obj["status"] = {}
    assert (rc_cells(obj)["Current"], rc_cells(obj)["Ready"]) == (0, 0)


def test_rc_scale_and_resolution():
    reg = default_registry()
    assert reg.resolve("rc") is REPLICATION_CONTROLLER
    assert reg.resolve("replicationcontrollers") is REPLICATION_CONTROLLER
    assert REPLICATION_CONTROLLER.scale is not None
    assert REPLICATION_CONTROLLER.field_selectable("status.replicas")


def test_rc_scale_subresource_prints_the_map_selector():
    from fleet.server.rest_subresources import to_scale

    obj = defaulted(rc(replicas=2, template=template({"app": "web", "tier": "fe"})))
    obj["metadata"].update(uid="u", resourceVersion="5")
    obj["status"] = {"replicas": 1}
    scale = to_scale(REPLICATION_CONTROLLER, obj)
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 1, "selector": "app=web,tier=fe"}


# ---------------------------------------------------------------------------
# PodTemplate


def podtemplate(t: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "PodTemplate",
                           "metadata": {"name": "tpl", "namespace": "default"}}
    if t is not None:
        obj["template"] = t
    return obj


def test_pod_template_defaults_and_any_restart_policy():
    obj = podtemplate(template({"app": "web"}, restartPolicy="Never"))
    assert POD_TEMPLATE.default is not None
    POD_TEMPLATE.default(obj)
    assert obj["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    assert obj["template"]["spec"]["restartPolicy"] == "Never"
    assert validate_pod_template_kind(obj, None) == []
    # The template stays mutable.
    new = copy.deepcopy(obj)
    new["template"]["spec"]["containers"][0]["image"] = "nginx:2"
    assert validate_pod_template_kind(new, obj) == []


@pytest.mark.parametrize(("t", "want"), [
    (None, ("template.spec.containers", "Required value")),
    ({"metadata": {"labels": {"bad key!": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}],
                                                          "restartPolicy": "Always", "dnsPolicy": "ClusterFirst"}},
     ("template.metadata.labels", None)),
    ({"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Sometimes",
               "dnsPolicy": "ClusterFirst"}},
     ("template.spec.restartPolicy", 'Unsupported value: "Sometimes": supported values: "Always", '
                                     '"OnFailure", "Never"')),
    ({"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
               "ephemeralContainers": [{"name": "e", "image": "i"}]}},
     ("template.spec.ephemeralContainers", "Forbidden: ephemeral containers not allowed in pod template")),
])
def test_pod_template_validation(t, want):
    got = fields(validate_pod_template_kind(podtemplate(t), None))
    path, message = want
    assert any(f == path or f.startswith(path + "[") or f.startswith(path + ".")
               for f, _ in got), got
    if message is not None:
        assert (path, message) in got, got


def test_pod_template_table_is_kubectls():
    cols = POD_TEMPLATE.table_columns()
    assert [c.name for c in cols] == ["Name", "Containers", "Images", "Pod Labels"]  # no AGE
    obj = podtemplate(template({"app": "web", "a": "b"}))
    cells = {c.name: c.value(obj) for c in cols}
    assert cells == {"Name": "tpl", "Containers": "c", "Images": "nginx", "Pod Labels": "a=b,app=web"}
    assert {c.name: c.value(podtemplate(template())) for c in cols}["Pod Labels"] == "<none>"
