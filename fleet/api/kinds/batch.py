"""The `batch/v1` kinds: Job and CronJob.

A Job's pods run to completion, so its template's restartPolicy must be
OnFailure or Never and is never defaulted (Kubernetes would default Always and
then reject it).  Kubernetes generates a Job's selector from its UID; Fleet
does the same in `default_job` whenever `metadata.uid` is already set, so the
server must assign the UID before calling `default`.
"""

from __future__ import annotations

import zoneinfo
from typing import Any

from fleet.api import meta
from fleet.api import validation as v
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
from fleet.api.kinds.cron import CronError, parse_cron
from fleet.api.registry import KindInfo

Cause = dict[str, str]

JOB_RESTART_POLICIES = ("OnFailure", "Never")
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
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
    if spec.get("podFailurePolicy") is None:
        set_default(spec, "podReplacementPolicy", "TerminatingOrFailed")
    pods.default_pod_template(spec.get("template"), restart_policy=False)


def default_job(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    default_job_spec(spec)
    if not isinstance(spec, dict) or spec.get("manualSelector") is True or spec.get("selector") is not None:
        return
    md = d(obj, "metadata")
    uid, name = md.get("uid"), md.get("name")
    if not uid:
        return
    spec["selector"] = {"matchLabels": {CONTROLLER_UID_LABEL: uid}}
    template = ensure_dict(spec, "template")
    if template is None:
        return
    tmeta = ensure_dict(template, "metadata")
    if tmeta is None:
        return
    labels = ensure_dict(tmeta, "labels")
    if labels is None:
        return
    labels[CONTROLLER_UID_LABEL] = uid
    labels["controller-uid"] = uid  # the legacy label, still added for old selectors
    if name:
        labels[JOB_NAME_LABEL] = name
        labels["job-name"] = name


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
    if mode == "Indexed" and spec.get("completions") is None:
        out.append(v.required(f"{path}.completions", "when completion mode is Indexed"))
    sel = spec.get("selector")
    selector = None
    if sel is not None:
        errs = v.validate_label_selector(sel, f"{path}.selector")
        out += errs
        selector = None if errs else sel
    elif spec.get("manualSelector") is True:
        out.append(v.required(f"{path}.selector"))
    out += v.validate_pod_template(
        spec.get("template"), f"{path}.template", selector=selector,
        restart_policies=JOB_RESTART_POLICIES,
        restart_policy_required_detail='valid values: "OnFailure", "Never"')
    return out


def validate_job(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    out += validate_job_spec(spec, "spec")
    if old is not None and isinstance(spec, dict):
        old_spec = d(old, "spec")
        # A Job's pods are built from the template it was created with; changing
        # it (or what selects the pods) mid-run would orphan or mix them.
        out += v.immutable(spec.get("selector"), old_spec.get("selector"), "spec.selector")
        out += v.immutable(spec.get("template"), old_spec.get("template"), "spec.template")
        out += v.immutable(spec.get("completionMode"), old_spec.get("completionMode"),
                           "spec.completionMode")
    return out


def _condition(o: dict[str, Any], ctype: str) -> bool:
    for c in dicts(lst(o, "status", "conditions")):
        if c.get("type") == ctype:
            return c.get("status") == "True"
    return False


def job_status(o: dict[str, Any]) -> str:
    if _condition(o, "Complete"):
        return "Complete"
    if _condition(o, "Failed"):
        return "Failed"
    if d(o, "metadata").get("deletionTimestamp"):
        return "Terminating"
    if _condition(o, "Suspended"):
        return "Suspended"
    if _condition(o, "FailureTarget"):
        return "FailureTarget"
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
        if "TZ=" in schedule:
            out.append(v.invalid("spec.schedule", schedule,
                                 "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"))
        else:
            try:
                parse_cron(schedule)
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

