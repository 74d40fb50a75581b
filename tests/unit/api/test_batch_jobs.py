"""Job and CronJob API rules kube-apiserver enforces: defaults, the generated
selector, pod failure policy, per-index limits, TZ in schedules."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds.batch import (
    default_cron_job,
    default_job,
    job_status,
    validate_cron_job,
    validate_job,
)

UID = "0d3c-uid"


def tmpl(restart: str = "Never", labels: dict[str, str] | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"spec": {"restartPolicy": restart, "containers": [{"name": "main", "image": "busybox"}]}}
    if labels:
        t["metadata"] = {"labels": labels}
    return t


def job(**spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"template": tmpl()}
    s.update(spec)
    obj = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "pi", "namespace": "default", "uid": UID}, "spec": s}
    default_job(obj)
    return obj


def causes(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    return sorted((c["field"], c["reason"]) for c in validate_job(obj, old))


def test_generated_selector_and_labels():
    j = job()
    assert j["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": UID}}
    assert j["spec"]["template"]["metadata"]["labels"] == {
        "batch.kubernetes.io/controller-uid": UID, "controller-uid": UID,
        "batch.kubernetes.io/job-name": "pi", "job-name": "pi"}
    assert causes(j) == []


def test_a_user_selector_without_manual_selector_is_refused():
    j = job(selector={"matchLabels": {"app": "x"}}, template=tmpl(labels={"app": "x"}))
    assert ("spec.selector", "FieldValueInvalid") in causes(j)
    msgs = [c["message"] for c in validate_job(j, None)]
    assert any("`selector` not auto-generated" in m for m in msgs)


def test_manual_selector():
    j = job(manualSelector=True, selector={"matchLabels": {"app": "x"}}, template=tmpl(labels={"app": "x"}))
    assert "controller-uid" not in j["spec"]["template"]["metadata"]["labels"]
    assert causes(j) == []
    missing = job(manualSelector=True)
    assert ("spec.selector", "FieldValueRequired") in causes(missing)


def test_a_conflicting_controller_uid_label_is_refused_not_overwritten():
    j = job(template=tmpl(labels={"batch.kubernetes.io/controller-uid": "someone-else"}))
    assert j["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == "someone-else"
    assert ("spec.template.metadata.labels[batch.kubernetes.io/controller-uid]", "FieldValueInvalid") in causes(j)


def test_replacement_policy_and_condition_status_defaults():
    assert job()["spec"]["podReplacementPolicy"] == "TerminatingOrFailed"
    j = job(podFailurePolicy={"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]})
    assert j["spec"]["podReplacementPolicy"] == "Failed"
    assert j["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"] == "True"
    assert causes(j) == []
    assert job(completionMode="Indexed", completions=3, backoffLimitPerIndex=1)["spec"]["backoffLimit"] == 2147483647


@pytest.mark.parametrize(("spec", "expected"), [
    ({"podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1, 42]}}]}},
     []),
    ({"podFailurePolicy": {"rules": [{"action": "Explode", "onExitCodes": {"operator": "In", "values": [1]}}]}},
     [("spec.podFailurePolicy.rules[0].action", "FieldValueNotSupported")]),
    ({"podFailurePolicy": {"rules": [{"action": "Count"}]}},
     [("spec.podFailurePolicy.rules[0]", "FieldValueInvalid")]),
    ({"podFailurePolicy": {"rules": [{"action": "Count", "onExitCodes": {"operator": "In", "values": [0]}}]}},
     [("spec.podFailurePolicy.rules[0].onExitCodes.values[0]", "FieldValueInvalid")]),
    ({"podFailurePolicy": {"rules": [{"action": "Count", "onExitCodes": {"operator": "In", "values": [5, 2]}}]}},
     [("spec.podFailurePolicy.rules[0].onExitCodes.values[1]", "FieldValueInvalid")]),
    ({"podFailurePolicy": {"rules": [{"action": "FailIndex",
                                      "onExitCodes": {"operator": "In", "values": [3]}}]}},
     [("spec.podFailurePolicy.rules[0].action", "FieldValueInvalid")]),
    ({"podFailurePolicy": {"rules": [{"action": "Count", "onExitCodes": {
        "containerName": "nope", "operator": "NotIn", "values": [3]}}]}},
     [("spec.podFailurePolicy.rules[0].onExitCodes.containerName", "FieldValueInvalid")]),
    ({"podFailurePolicy": {"rules": []}, "template": tmpl("OnFailure")},
     [("spec.template.spec.restartPolicy", "FieldValueInvalid")]),
    ({"podFailurePolicy": {"rules": []}, "podReplacementPolicy": "TerminatingOrFailed"},
     [("spec.podReplacementPolicy", "FieldValueNotSupported")]),
    ({"backoffLimitPerIndex": 1}, [("spec.backoffLimitPerIndex", "FieldValueForbidden")]),
    ({"completionMode": "Indexed", "completions": 3, "maxFailedIndexes": 1},
     [("spec.backoffLimitPerIndex", "FieldValueRequired")]),
    ({"completionMode": "Indexed", "completions": 3, "backoffLimitPerIndex": 1, "maxFailedIndexes": 4},
     [("spec.maxFailedIndexes", "FieldValueInvalid")]),
    ({"completionMode": "Indexed", "completions": 200_000},
     [("spec.completions", "FieldValueInvalid")]),
])
def test_job_spec_validation(spec, expected):
    assert causes(job(**spec)) == sorted(expected)


def test_completions_immutable_except_elastic_indexed():
    old = job(completions=3, parallelism=3)
    new = copy.deepcopy(old)
    new["spec"]["completions"] = 4
    assert ("spec.completions", "FieldValueInvalid") in causes(new, old)
    old = job(completions=3, parallelism=3, completionMode="Indexed")
    new = copy.deepcopy(old)
    new["spec"]["completions"] = new["spec"]["parallelism"] = 5
    assert causes(new, old) == []


def cron(schedule: str, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"schedule": schedule, "jobTemplate": {"spec": {"template": tmpl()}}}
    s.update(spec)
    obj = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "default"},
           "spec": s}
    default_cron_job(obj)
    return obj


def test_tz_in_schedule_refused_but_ratcheted():
    bad = cron("CRON_TZ=UTC 0 * * * *")
    [c] = validate_cron_job(bad, None)
    assert c["message"].endswith("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")
    # Stored before the rule: an unrelated update keeps it valid ...
    changed = copy.deepcopy(bad)
    changed["spec"]["suspend"] = True
    assert validate_cron_job(changed, bad) == []
    # ... but not combined with timeZone.
    both = copy.deepcopy(bad)
    both["spec"]["timeZone"] = "UTC"
    [c] = validate_cron_job(both, bad)
    assert "cannot use both timeZone field and TZ or CRON_TZ in schedule" in c["message"]
    assert validate_cron_job(cron("@hourly", timeZone="Europe/Paris"), None) == []


def test_job_status_column():
    assert job_status({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}}) == \
        "SuccessCriteriaMet"
    assert job_status({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"},
                                                 {"type": "Complete", "status": "True"}]}}) == "Complete"
