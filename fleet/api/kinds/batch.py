"""The `batch/v1` kinds: Job and CronJob.

A Job's pods run to completion, so its template's restartPolicy must be
OnFailure or Never and is never defaulted (Kubernetes would default Always and
then reject it).  Kubernetes generates a Job's selector from its UID; Fleet
does the same in `default_job` whenever `metadata.uid` is already set, so the
server must assign the UID before calling `default`.
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Any

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.conditions import is_true
from fleet.api.cron import CronError, parse_cron
from fleet.api.kinds import pods
from fleet.api.kinds._common import (
    NONE,
    col,
    d,
    dicts,
    ensure_dict,
    format_label_selector,
    lst,
    num,
    set_default,
    since,
    table,
    wide_container_columns,
)
from fleet.api.kinds.pod_validation import validate_pod_template
from fleet.api.registry import KindInfo
from fleet.api.selectors import selector_dict_matches

Cause = dict[str, str]

JOB_RESTART_POLICIES = ("OnFailure", "Never")
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
LEGACY_JOB_NAME_LABEL = "job-name"
POD_FAILURE_POLICY_ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")
POD_REPLACEMENT_POLICIES = ("TerminatingOrFailed", "Failed")
MAX_POD_FAILURE_POLICY_RULES = 20
MAX_EXIT_CODE_VALUES = 255
# Indexed Jobs keep per-index bookkeeping in status strings; Kubernetes caps them.
MAX_INDEXED_COMPLETIONS = 100_000
MAX_INDEXED_PARALLELISM = 100_000
MAX_FAILED_INDEXES_LIMIT = 100_000
# A CronJob's name plus an 11-character scheduled-time suffix must fit in a 63-character label.
CRONJOB_NAME_MAX = 52

# ---------------------------------------------------------------------------
# Job
# ---------------------------------------------------------------------------


def default_job_spec(spec: Any) -> None:
    if not isinstance(spec, dict):
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    set_default(spec, "parallelism", 1)
    if spec.get("backoffLimit") is None:
        # With per-index limits the global limit is effectively off.
        spec["backoffLimit"] = 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6
    set_default(spec, "completionMode", "NonIndexed")
    set_default(spec, "suspend", False)
    policy = spec.get("podFailurePolicy")
    # A pod failure policy judges a pod by how it ended, so with one the
    # controller waits for pods to finish before replacing them (Kubernetes'
    # default for podReplacementPolicy follows the same rule).
    set_default(spec, "podReplacementPolicy", "Failed" if policy is not None else "TerminatingOrFailed")
    if isinstance(policy, dict):
        for rule in dicts(lst(policy, "rules")):
            for pattern in dicts(lst(rule, "onPodConditions")):
                set_default(pattern, "status", "True")
    pods.default_pod_template(spec.get("template"), restart_policy=False)


def default_job(obj: dict[str, Any]) -> None:
    """Job defaults plus the generated selector, as kube-apiserver's Job strategy.

    Unless `manualSelector` is true the selector is generated: the template gets
    the controller-uid and job-name labels (both the batch.kubernetes.io/ and the
    legacy unprefixed forms, never overwriting what the user set — a conflict is
    then refused by validation) and the selector's matchLabels gets controller-uid.
    A user-supplied selector is kept, so validation can refuse it ("`selector`
    not auto-generated") instead of it being silently replaced."""
    spec = obj.get("spec")
    default_job_spec(spec)
    if not isinstance(spec, dict) or spec.get("manualSelector") is True:
        return
    md = d(obj, "metadata")
    uid, name = md.get("uid"), md.get("name")
    if not uid:
        return
    template = ensure_dict(spec, "template")
    if template is None:
        return
    tmeta = ensure_dict(template, "metadata")
    if tmeta is None:
        return
    labels = ensure_dict(tmeta, "labels")
    if labels is None:
        return
    if name:
        labels.setdefault(LEGACY_JOB_NAME_LABEL, name)
        labels.setdefault(JOB_NAME_LABEL, name)
    labels.setdefault(LEGACY_CONTROLLER_UID_LABEL, uid)
    labels.setdefault(CONTROLLER_UID_LABEL, uid)
    selector = spec.get("selector")
    if selector is None:
        selector = spec["selector"] = {}
    if not isinstance(selector, dict):
        return
    match_labels = ensure_dict(selector, "matchLabels")
    if match_labels is not None:
        match_labels.setdefault(CONTROLLER_UID_LABEL, uid)


def _validate_pod_failure_policy(policy: Any, spec: dict[str, Any], path: str) -> list[Cause]:
    """kube-apiserver's rules for `podFailurePolicy` (batch validation)."""
    if not isinstance(policy, dict):
        return [v.type_invalid(path, policy, "object")]
    out: list[Cause] = []
    restart = d(spec, "template", "spec").get("restartPolicy")
    if restart is not None and restart != "Never":
        out.append(v.invalid(f"{path.rsplit('.', 1)[0]}.template.spec.restartPolicy", restart,
                             "only \"Never\" is supported when podFailurePolicy is specified"))
    rules = policy.get("rules")
    if not isinstance(rules, list):
        return out + [v.required(f"{path}.rules") if rules is None else v.type_invalid(f"{path}.rules", rules, "array")]
    if len(rules) > MAX_POD_FAILURE_POLICY_RULES:
        out.append(v.invalid(f"{path}.rules", len(rules),
                             f"must have at most {MAX_POD_FAILURE_POLICY_RULES} items"))
    containers = {c.get("name") for c in dicts(lst(spec, "template", "spec", "containers"))} | \
        {c.get("name") for c in dicts(lst(spec, "template", "spec", "initContainers"))}
    for i, rule in enumerate(rules):
        rp = f"{path}.rules[{i}]"
        if not isinstance(rule, dict):
            out.append(v.type_invalid(rp, rule, "object"))
            continue
        action = rule.get("action")
        if action is None:
            out.append(v.required(f"{rp}.action"))
        elif action not in POD_FAILURE_POLICY_ACTIONS:
            out.append(v.not_supported(f"{rp}.action", action, POD_FAILURE_POLICY_ACTIONS))
        elif action == "FailIndex" and spec.get("backoffLimitPerIndex") is None:
            out.append(v.invalid(f"{rp}.action", action,
                                 "requires the backoffLimitPerIndex to be set"))
        exit_codes, conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if (exit_codes is None) == (conditions is None):
            out.append(v.invalid(rp, "", "specifying one of OnExitCodes and OnPodConditions is required"))
            continue
        if exit_codes is not None:
            out += _validate_on_exit_codes(exit_codes, f"{rp}.onExitCodes", containers)
        else:
            if not isinstance(conditions, list):
                out.append(v.type_invalid(f"{rp}.onPodConditions", conditions, "array"))
                continue
            for j, pattern in enumerate(conditions):
                pp = f"{rp}.onPodConditions[{j}]"
                if not isinstance(pattern, dict):
                    out.append(v.type_invalid(pp, pattern, "object"))
                    continue
                if not pattern.get("type"):
                    out.append(v.required(f"{pp}.type"))
                status = pattern.get("status")
                if status not in ("True", "False", "Unknown"):
                    out.append(v.not_supported(f"{pp}.status", status, ("True", "False", "Unknown")))
    return out


def _validate_on_exit_codes(req: Any, path: str, containers: set[Any]) -> list[Cause]:
    if not isinstance(req, dict):
        return [v.type_invalid(path, req, "object")]
    out: list[Cause] = []
    name = req.get("containerName")
    if name is not None and name not in containers:
        out.append(v.invalid(f"{path}.containerName", name,
                             "must be one of the container or initContainer names in the pod template"))
    op = req.get("operator")
    if op not in ("In", "NotIn"):
        out.append(v.not_supported(f"{path}.operator", op, ("In", "NotIn")))
    values = req.get("values")
    if not isinstance(values, list) or not values:
        return out + [v.required(f"{path}.values")]
    if len(values) > MAX_EXIT_CODE_VALUES:
        out.append(v.invalid(f"{path}.values", len(values), f"must have at most {MAX_EXIT_CODE_VALUES} items"))
    previous: int | None = None
    for k, value in enumerate(values):
        vp = f"{path}.values[{k}]"
        if v.as_int(value) is None:
            out.append(v.type_invalid(vp, value, "integer"))
            continue
        if value == 0 and op == "In":
            out.append(v.invalid(vp, value, "must not be 0 for the In operator"))
        if previous is not None and value == previous:
            out.append(v.duplicate(vp, value))
        elif previous is not None and value < previous:
            out.append(v.invalid(vp, value, "must be ordered"))
        previous = value
    return out


def validate_job_spec(spec: Any, path: str) -> list[Cause]:
    if not isinstance(spec, dict):
        return [v.required(path) if spec is None else v.type_invalid(path, spec, "object")]
    out: list[Cause] = []
    for key in ("parallelism", "completions", "backoffLimit", "ttlSecondsAfterFinished",
                "backoffLimitPerIndex", "maxFailedIndexes"):
        v.nonnegative(spec, key, f"{path}.{key}", out)
    v.positive(spec, "activeDeadlineSeconds", f"{path}.activeDeadlineSeconds", out)
    mode = spec.get("completionMode")
    if mode is not None and mode not in ("NonIndexed", "Indexed"):
        out.append(v.not_supported(f"{path}.completionMode", mode, ("NonIndexed", "Indexed")))
    completions = v.as_int(spec.get("completions"))
    if mode == "Indexed":
        if spec.get("completions") is None:
            out.append(v.required(f"{path}.completions", "when completion mode is Indexed"))
        elif completions is not None and completions > MAX_INDEXED_COMPLETIONS:
            out.append(v.invalid(f"{path}.completions", completions,
                                 f"must be less than or equal to {MAX_INDEXED_COMPLETIONS} "
                                 "when completion mode is Indexed"))
        parallelism = v.as_int(spec.get("parallelism"))
        if parallelism is not None and parallelism > MAX_INDEXED_PARALLELISM:
            out.append(v.invalid(f"{path}.parallelism", parallelism,
                                 f"must be less than or equal to {MAX_INDEXED_PARALLELISM} "
                                 "when completion mode is Indexed"))
    if spec.get("backoffLimitPerIndex") is not None and mode != "Indexed":
        out.append(v.forbidden(f"{path}.backoffLimitPerIndex", "requires indexed completion mode"))
    max_failed = v.as_int(spec.get("maxFailedIndexes"))
    if spec.get("maxFailedIndexes") is not None:
        if spec.get("backoffLimitPerIndex") is None:
            out.append(v.required(f"{path}.backoffLimitPerIndex",
                                  "when maxFailedIndexes is specified"))
        if max_failed is not None and completions is not None and max_failed > completions:
            out.append(v.invalid(f"{path}.maxFailedIndexes", max_failed,
                                 "must be less than or equal to completions"))
        if max_failed is not None and max_failed > MAX_FAILED_INDEXES_LIMIT:
            out.append(v.invalid(f"{path}.maxFailedIndexes", max_failed,
                                 f"must be less than or equal to {MAX_FAILED_INDEXES_LIMIT}"))
    replacement = spec.get("podReplacementPolicy")
    if replacement is not None:
        if replacement not in POD_REPLACEMENT_POLICIES:
            out.append(v.not_supported(f"{path}.podReplacementPolicy", replacement, POD_REPLACEMENT_POLICIES))
        elif spec.get("podFailurePolicy") is not None and replacement != "Failed":
            out.append(v.not_supported(f"{path}.podReplacementPolicy", replacement, ("Failed",)))
    if spec.get("podFailurePolicy") is not None:
        out += _validate_pod_failure_policy(spec["podFailurePolicy"], spec, f"{path}.podFailurePolicy")
    sel = spec.get("selector")
    selector = None
    if sel is not None:
        errs = v.validate_label_selector(sel, f"{path}.selector")
        out += errs
        selector = None if errs else sel
    elif spec.get("manualSelector") is True:
        out.append(v.required(f"{path}.selector"))
    out += validate_pod_template(
        spec.get("template"), f"{path}.template", selector=selector,
        restart_policies=JOB_RESTART_POLICIES,
        restart_policy_required_detail='valid values: "OnFailure", "Never"')
    return out


def _validate_generated_selector(obj: dict[str, Any]) -> list[Cause]:
    """Without `manualSelector`, the selector and template labels must be the
    generated ones: selecting by another label could adopt a stranger's pods."""
    spec, md = d(obj, "spec"), d(obj, "metadata")
    uid = md.get("uid")
    if spec.get("manualSelector") is True or not uid:
        return []
    labels = d(spec, "template", "metadata").get("labels")
    if not isinstance(labels, dict) or not labels.get(CONTROLLER_UID_LABEL):
        return [v.required(f"spec.template.metadata.labels[{CONTROLLER_UID_LABEL}]",
                           "must be the Job's UID when selector is autogenerated")]
    out: list[Cause] = []
    if labels.get(CONTROLLER_UID_LABEL) != uid:
        out.append(v.invalid(f"spec.template.metadata.labels[{CONTROLLER_UID_LABEL}]",
                             labels.get(CONTROLLER_UID_LABEL), f"must be '{uid}'"))
    name = md.get("name")
    if name and labels.get(JOB_NAME_LABEL) not in (None, name):
        out.append(v.invalid(f"spec.template.metadata.labels[{JOB_NAME_LABEL}]",
                             labels.get(JOB_NAME_LABEL), f"must be '{name}'"))
    sel = spec.get("selector")
    if sel is None:
        return out + [v.required("spec.selector")]
    if isinstance(sel, dict) and not v.validate_label_selector(sel, "spec.selector") and \
            not selector_dict_matches(sel, {CONTROLLER_UID_LABEL: uid}):
        out.append(v.invalid("spec.selector", sel, "`selector` not auto-generated"))
    return out


def validate_job(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    out += validate_job_spec(spec, "spec")
    if isinstance(spec, dict):
        out += _validate_generated_selector(obj)
    if old is not None and isinstance(spec, dict):
        old_spec = d(old, "spec")
        # A Job's pods are built from the template it was created with; changing
        # it (or what selects the pods) mid-run would orphan or mix them.
        out += v.immutable(spec.get("selector"), old_spec.get("selector"), "spec.selector")
        out += v.immutable(spec.get("template"), old_spec.get("template"), "spec.template")
        for key in ("completionMode", "podFailurePolicy", "backoffLimitPerIndex", "manualSelector"):
            out += v.immutable(spec.get(key), old_spec.get(key), f"spec.{key}")
        if spec.get("completions") != old_spec.get("completions"):
            # Only an elastic Indexed Job (completions == parallelism, before and
            # after) may change its completions.
            elastic = spec.get("completionMode") == "Indexed" and \
                spec.get("completions") == spec.get("parallelism") and \
                old_spec.get("completions") == old_spec.get("parallelism")
            if not elastic:
                out += v.immutable(spec.get("completions"), old_spec.get("completions"), "spec.completions")
    return out


def job_status(o: dict[str, Any]) -> str:
    if is_true(o, "Complete"):
        return "Complete"
    if is_true(o, "Failed"):
        return "Failed"
    if d(o, "metadata").get("deletionTimestamp"):
        return "Terminating"
    if is_true(o, "Suspended"):
        return "Suspended"
    if is_true(o, "FailureTarget"):
        return "FailureTarget"
    if is_true(o, "SuccessCriteriaMet"):
        return "SuccessCriteriaMet"
    return "Running"


def job_completions(o: dict[str, Any]) -> str:
    spec, succeeded = d(o, "spec"), num(d(o, "status").get("succeeded"))
    if spec.get("completions") is not None:
        return f"{succeeded}/{num(spec.get('completions'))}"
    parallelism = num(spec.get("parallelism"))
    if parallelism > 1:
        return f"{succeeded}/1 of {parallelism}"
    return f"{succeeded}/1"


def job_duration(o: dict[str, Any]) -> str:
    status = d(o, "status")
    start, end = status.get("startTime"), status.get("completionTime")
    if not start:
        return ""
    if not end:
        return since(start)
    try:
        delta = meta.parse_rfc3339(end) - meta.parse_rfc3339(start)
    except ValueError:
        return ""
    return meta.human_duration(delta.total_seconds())


def _job_template_spec(o: dict[str, Any]) -> dict[str, Any]:
    return d(o, "spec", "template", "spec")


JOB = KindInfo(
    zero_status={},
    group="batch", version="v1", kind="Job", plural="jobs", singular="job",
    categories=("all",), subresources=("status",),
    columns_override=table(
        col("Status", job_status, description="Status of the job."),
        col("Completions", job_completions,
            description="The number of pods which reached phase Succeeded."),
        col("Duration", job_duration, description="Time required to complete the job."),
        wide=(*wide_container_columns(_job_template_spec),
              col("Selector", lambda o: format_label_selector(d(o, "spec").get("selector")), priority=1,
                  description="A label query over pods that should match the pod count.")),
    ),
    default=default_job, validate=validate_job,
    selectable_fields=("status.successful",),
)

# ---------------------------------------------------------------------------
# CronJob
# ---------------------------------------------------------------------------


def default_cron_job(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    set_default(spec, "concurrencyPolicy", "Allow")
    set_default(spec, "suspend", False)
    set_default(spec, "successfulJobsHistoryLimit", 3)
    set_default(spec, "failedJobsHistoryLimit", 1)
    jt = spec.get("jobTemplate")
    if isinstance(jt, dict):
        default_job_spec(jt.get("spec"))


def _valid_time_zone(tz: str) -> bool:
    if tz in ("", "Local") or tz.startswith("/") or ".." in tz:
        # Kubernetes refuses "Local" (it depends on the controller's host).
        return False
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def validate_cron_job(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    name = d(obj, "metadata").get("name")
    if isinstance(name, str) and len(name) > CRONJOB_NAME_MAX:
        out.append(v.invalid("metadata.name", name, v.max_len_error(CRONJOB_NAME_MAX)))
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec") if spec is None else v.type_invalid("spec", spec, "object")]
    schedule = spec.get("schedule")
    if not schedule:
        out.append(v.required("spec.schedule"))
    elif not isinstance(schedule, str):
        out.append(v.type_invalid("spec.schedule", schedule, "string"))
    else:
        # A TZ/CRON_TZ prefix is refused, except (ratcheting, as Kubernetes) in an
        # object that already had one: it stays valid until the schedule changes.
        old_schedule = str(d(old, "spec").get("schedule") or "") if old is not None else ""
        allow_tz = "TZ" in old_schedule
        tz_prefix = re.match(r"^(?:CRON_TZ|TZ)=\S+\s+", schedule.strip())
        if "TZ" in schedule and not allow_tz:
            out.append(v.invalid("spec.schedule", schedule,
                                 "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"))
        elif "TZ" in schedule and spec.get("timeZone") is not None:
            out.append(v.invalid("spec.schedule", schedule,
                                 "cannot use both timeZone field and TZ or CRON_TZ in schedule"))
        else:
            try:
                parse_cron(schedule.strip()[tz_prefix.end():] if tz_prefix else schedule)
            except CronError as e:
                out.append(v.invalid("spec.schedule", schedule, str(e)))
    tz = spec.get("timeZone")
    if tz is not None and not (isinstance(tz, str) and _valid_time_zone(tz)):
        out.append(v.invalid("spec.timeZone", tz, f"unknown time zone {tz}"))
    cp = spec.get("concurrencyPolicy")
    if cp is not None and cp not in ("Allow", "Forbid", "Replace"):
        out.append(v.not_supported("spec.concurrencyPolicy", cp, ("Allow", "Forbid", "Replace")))
    for key in ("startingDeadlineSeconds", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
        v.nonnegative(spec, key, f"spec.{key}", out)
    jt = spec.get("jobTemplate")
    if not isinstance(jt, dict):
        out.append(v.required("spec.jobTemplate") if jt is None else v.type_invalid("spec.jobTemplate", jt, "object"))
    else:
        out += v.validate_labels(d(jt, "metadata").get("labels"), "spec.jobTemplate.metadata.labels")
        out += validate_job_spec(jt.get("spec"), "spec.jobTemplate.spec")
    return out


def _last_schedule(o: dict[str, Any]) -> str:
    t = d(o, "status").get("lastScheduleTime")
    return since(t) if t else NONE


def _bool_cell(val: Any) -> str:
    if isinstance(val, bool):
        return "True" if val else "False"
    return "<unset>"


def _cron_template_spec(o: dict[str, Any]) -> dict[str, Any]:
    return d(o, "spec", "jobTemplate", "spec", "template", "spec")


CRON_JOB = KindInfo(
    zero_status={},
    group="batch", version="v1", kind="CronJob", plural="cronjobs", singular="cronjob",
    short_names=("cj",), categories=("all",), subresources=("status",),
    columns_override=table(
        col("Schedule", lambda o: d(o, "spec").get("schedule", ""),
            description="The schedule in Cron format."),
        col("Timezone", lambda o: d(o, "spec").get("timeZone") or NONE,
            description="The time zone name for the given schedule."),
        col("Suspend", lambda o: _bool_cell(d(o, "spec").get("suspend")), type="boolean",
            description="This flag tells the controller to suspend subsequent executions."),
        col("Active", lambda o: len(lst(o, "status", "active")), type="integer",
            description="A list of pointers to currently running jobs."),
        col("Last Schedule", _last_schedule,
            description="Information when was the last time the job was successfully scheduled."),
        wide=(*wide_container_columns(_cron_template_spec),
              col("Selector", lambda o: format_label_selector(d(o, "spec", "jobTemplate", "spec").get("selector")),
                  priority=1, description="A label query over pods that should match the pod count.")),
    ),
    default=default_cron_job, validate=validate_cron_job,
)

KINDS = (JOB, CRON_JOB)

