"""fleet.dev/v1 ProcessControl: validation, matching and the refusal message (pure)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from fleet.api.kinds import processcontrol as pc
from fleet.api.registry import default_registry


def obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"subjects": [{"kind": "User", "name": "alice"}], "actions": ["exec"]}
    base.update(spec)
    return {"apiVersion": pc.API_VERSION, "kind": pc.KIND,
            "metadata": {"name": "oncall", "namespace": "shop"}, "spec": base}


def req(action: str = "exec", *, user: str = "alice", groups: tuple[str, ...] = (),
        labels: dict[str, str] | None = None, container: str = "web", sig: str = "") -> pc.Request:
    return pc.Request(action, "shop", user, groups, labels or {"app": "web"}, container, sig)


def fields(causes: list[dict[str, str]]) -> list[str]:
    return [c["field"] for c in causes]


def test_registered_with_short_name_and_columns() -> None:
    info = default_registry().resolve("pctl")
    assert info is not None and info.kind == "ProcessControl" and info.group == "fleet.dev"
    assert info.namespaced
    names = [c.name for c in info.table_columns()]
    assert names[:4] == ["Name", "Subjects", "Actions", "Containers"]


def test_valid_object_has_no_causes() -> None:
    o = obj(actions=["exec", "signal"], signals=["SIGHUP", "USR1"], containers=["web"],
            podSelector={"matchLabels": {"app": "web"}},
            subjects=[{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "sre"},
                      {"kind": "ServiceAccount", "name": "debugger", "namespace": "shop"}])
    assert pc.validate(o) == []


@pytest.mark.parametrize(("spec", "field", "reason"), [
    ({"subjects": []}, "spec.subjects", "FieldValueRequired"),
    ({"subjects": [{"kind": "Robot", "name": "x"}]}, "spec.subjects[0].kind", "FieldValueNotSupported"),
    ({"subjects": [{"kind": "User"}]}, "spec.subjects[0].name", "FieldValueRequired"),
    ({"subjects": [{"kind": "User", "name": "a", "namespace": "x"}]}, "spec.subjects[0].namespace",
     "FieldValueInvalid"),
    ({"actions": []}, "spec.actions", "FieldValueRequired"),
    ({"actions": ["ssh"]}, "spec.actions[0]", "FieldValueNotSupported"),
    ({"actions": ["exec", "exec"]}, "spec.actions[1]", "FieldValueDuplicate"),
    ({"actions": ["signal"], "signals": ["SIGNOPE"]}, "spec.signals[0]", "FieldValueInvalid"),
    ({"signals": ["SIGHUP"]}, "spec.signals", "FieldValueInvalid"),  # without the signal action
    ({"containers": ["Bad_Name"]}, "spec.containers[0]", "FieldValueInvalid"),
    ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Nope"}]}},
     "spec.podSelector.matchExpressions[0].operator", "FieldValueInvalid"),
])
def test_field_errors(spec: dict[str, Any], field: str, reason: str) -> None:
    causes = pc.validate(obj(**spec))
    assert field in fields(causes), causes
    assert reason in [c["reason"] for c in causes if c["field"] == field]


def test_missing_spec_is_required() -> None:
    o = obj()
    del o["spec"]
    assert fields(pc.validate(o)) == ["spec"]


def test_service_account_subject_namespace_defaults_to_the_objects() -> None:
    o = obj(subjects=[{"kind": "ServiceAccount", "name": "debugger"}])
    pc.PROCESS_CONTROL.default(o)  # type: ignore[misc]
    assert o["spec"]["subjects"][0]["namespace"] == "shop"


@pytest.mark.parametrize(("value", "expected"), [
    ("SIGHUP", signal.SIGHUP), ("hup", signal.SIGHUP), ("USR1", signal.SIGUSR1), ("9", signal.SIGKILL),
    (15, signal.SIGTERM), ("SIGNOPE", None), ("", None), (True, None), ("SIGRTMIN", None), (1000, None),
])
def test_parse_signal(value: Any, expected: int | None) -> None:
    assert pc.parse_signal(value) == expected


# ------------------------------------------------------------------ matching
@pytest.mark.parametrize(("spec", "request_", "allowed"), [
    ({}, req(), True),
    ({}, req(user="bob"), False),
    ({"subjects": [{"kind": "Group", "name": "sre"}]}, req(user="bob", groups=("sre",)), True),
    ({"subjects": [{"kind": "Group", "name": "sre"}]}, req(user="bob", groups=("dev",)), False),
    ({"subjects": [{"kind": "ServiceAccount", "name": "dbg"}]},
     req(user="system:serviceaccount:shop:dbg"), True),
    ({"subjects": [{"kind": "ServiceAccount", "name": "dbg", "namespace": "other"}]},
     req(user="system:serviceaccount:shop:dbg"), False),
    ({}, req("attach"), False),  # the action is not listed
    ({"actions": ["exec", "attach"]}, req("attach"), True),
    ({"containers": ["web"]}, req(container="web"), True),
    ({"containers": ["web"]}, req(container="sidecar"), False),
    ({"actions": ["portforward"], "containers": ["web"]}, req("portforward", container=""), True),
    ({"podSelector": {"matchLabels": {"app": "web"}}}, req(labels={"app": "web"}), True),
    ({"podSelector": {"matchLabels": {"app": "web"}}}, req(labels={"app": "db"}), False),
    ({"podSelector": {}}, req(labels={"app": "db"}), True),
    ({"actions": ["signal"]}, req("signal", sig="SIGKILL"), True),  # no signals listed: any
    ({"actions": ["signal"], "signals": ["HUP"]}, req("signal", sig="SIGHUP"), True),
    ({"actions": ["signal"], "signals": ["SIGHUP"]}, req("signal", sig="SIGTERM"), False),
])
def test_allows(spec: dict[str, Any], request_: pc.Request, allowed: bool) -> None:
    assert pc.allows(obj(**spec), request_) is allowed


def test_allowing_names_the_first_consenting_object_and_ignores_other_namespaces() -> None:
    a = obj(actions=["attach"])
    a["metadata"]["name"] = "a-attach"
    b = obj()
    b["metadata"]["name"] = "b-exec"
    c = obj()
    c["metadata"].update(name="a-elsewhere", namespace="other")
    assert pc.allowing([c, b, a], req()) == "b-exec"
    assert pc.allowing([a, c], req()) is None
    assert pc.allowing([], req()) is None


def test_refusal_message_names_the_missing_process_control() -> None:
    assert pc.refusal_message("p", req(container="c")) == (
        'pods "p" is forbidden: no ProcessControl in namespace "shop" allows user "alice" '
        'to exec in container "c"')
    assert "to send SIGHUP to container" in pc.refusal_message("p", req("signal", sig="SIGHUP"))
    assert 'to port-forward to pod "p"' in pc.refusal_message("p", req("portforward", container=""))


def test_signal_request_validation() -> None:
    assert pc.validate_signal_request({"signal": "SIGHUP", "container": "c"}) == []
    assert fields(pc.validate_signal_request({})) == ["signal"]
    assert fields(pc.validate_signal_request({"signal": "SIGNOPE"})) == ["signal"]
    assert fields(pc.validate_signal_request({"signal": "HUP", "container": 3})) == ["container"]
