"""An in-memory API for the Job and CronJob controllers' MockClock tests.

The controllers talk to `ctx.client` (create, replace, patch, delete, get_object)
and read shared informers.  `FakeCluster` is that client: it keeps objects with
resourceVersions, generateName, uids and the finalizer protocol, runs the real
defaulting and validation of the kinds (so a Job gets its generated selector and
a bad pod is refused), applies merge and strategic merge patches with the real
code, and feeds every change straight into the informers, synchronously — a
watch with no delay.  Nothing here sleeps or uses threads, so Trio's MockClock
(autojump) measures the controllers' own waits exactly.

`wall()` is the fake wall clock: a fixed epoch plus Trio's clock, so wall-clock
deadlines, back-offs and cron schedules move with the MockClock.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from typing import Any

import trio

from fleet.api.errors import Invalid
from fleet.api.patch import json_merge_patch, json_patch, strategic_merge_patch
from fleet.api.registry import default_registry
from fleet.client import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiException
from fleet.controllers.runtime import Context, InformerFactory, by_namespace

EPOCH = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
REGISTRY = default_registry()


def wall() -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=trio.current_time())


def ts(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, message: str) -> ApiException:
    return ApiException({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": message, "code": code}, code)


class Recorder:
    """Stands in for the EventRecorder: keeps (object name, type, reason, message)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(((obj.get("metadata") or {}).get("name", ""), type_, reason, message))

    def reasons(self, name: str | None = None) -> list[str]:
        return [r for n, _, r, _ in self.events if name is None or n == name]


class FakeCluster:
    """The client calls the batch controllers make, over dicts, feeding informers."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self._names = itertools.count(1)
        self.informers = InformerFactory(self)  # type: ignore[arg-type]
        self.events = Recorder()
        self.ctx = Context(client=self, informers=self.informers, events=self.events)  # type: ignore[arg-type]
        self.calls: list[tuple[str, str, str]] = []  # (verb, plural, name)
        self.created_at: dict[str, float] = {}  # object name -> Trio time of its create
        self.fail: dict[tuple[str, str], ApiException] = {}  # (verb, plural) -> error to raise once

    # -- informers ------------------------------------------------------------------------
    def start(self) -> None:
        """Call after the controllers' setup: give every informer what exists now."""
        for (api_version, plural, _), inf in self.informers._informers.items():
            inf.add_index("namespace", by_namespace)
            for obj in self.objects.get((api_version, plural), {}).values():
                inf._apply("ADDED", copy.deepcopy(obj))
            inf.synced.set()

    def _publish(self, api_version: str, plural: str, etype: str, obj: dict[str, Any]) -> None:
        for (av, pl, _), inf in self.informers._informers.items():
            if (av, pl) == (api_version, plural):
                inf._apply(etype, copy.deepcopy(obj))

    # -- helpers ----------------------------------------------------------------------------
    def _info(self, api_version: str, plural: str) -> Any:
        group, _, version = api_version.rpartition("/")
        info = REGISTRY.get(group, version, plural)
        assert info is not None, (api_version, plural)
        return info

    def _bucket(self, api_version: str, plural: str) -> dict[str, dict[str, Any]]:
        return self.objects.setdefault((api_version, plural), {})

    def _maybe_fail(self, verb: str, plural: str) -> None:
        err = self.fail.pop((verb, plural), None)
        if err is not None:
            raise err

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._bucket(api_version, plural).get(f"{namespace}/{name}")
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for k, o in sorted(self._bucket(api_version, plural).items())
                if namespace is None or k.startswith(f"{namespace}/")]

    def _store(self, api_version: str, plural: str, obj: dict[str, Any], etype: str) -> dict[str, Any]:
        md = obj["metadata"]
        md["resourceVersion"] = str(next(self._rv))
        key = f"{md.get('namespace', '')}/{md['name']}"
        self._bucket(api_version, plural)[key] = obj
        self._publish(api_version, plural, etype, obj)
        return copy.deepcopy(obj)

    def _remove(self, api_version: str, plural: str, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        md["resourceVersion"] = str(next(self._rv))
        self._bucket(api_version, plural).pop(f"{md.get('namespace', '')}/{md['name']}", None)
        self._publish(api_version, plural, "DELETED", obj)

    # -- the client surface ----------------------------------------------------------------
    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("create", plural)
        obj = copy.deepcopy(body)
        md = obj.setdefault("metadata", {})
        md["namespace"] = namespace or md.get("namespace") or "default"
        if not md.get("name"):
            md["name"] = f"{md['generateName']}{next(self._names):05d}"
        self.calls.append(("create", plural, md["name"]))
        if f"{md['namespace']}/{md['name']}" in self._bucket(api_version, plural):
            raise _status(409, f'{plural} "{md["name"]}" already exists')
        md["uid"] = f"uid-{next(self._uid)}"
        md["creationTimestamp"] = ts(wall())
        md["generation"] = 1
        self.created_at[md["name"]] = trio.current_time()
        info = self._info(api_version, plural)
        if info.has_status and plural != "pods":
            obj.pop("status", None)
        if info.default is not None:
            info.default(obj)
        causes = info.validate(obj, None) if info.validate is not None else []
        if causes:
            raise _status(422, f"invalid {plural}: {causes}")
        return self._store(api_version, plural, obj, "ADDED")

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, *, subresource: str | None = None,
                      **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("replace", plural)
        self.calls.append(("replace" + (f"/{subresource}" if subresource else ""), plural, name))
        cur = self._bucket(api_version, plural).get(f"{namespace}/{name}")
        if cur is None:
            raise _status(404, f'{plural} "{name}" not found')
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != cur["metadata"]["resourceVersion"]:
            raise _status(409, f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                               "modified; please apply your changes to the latest version and try again")
        new = copy.deepcopy(cur)
        if subresource == "status":
            new["status"] = copy.deepcopy(body.get("status") or {})
        else:
            new["spec"] = copy.deepcopy(body.get("spec"))
            new["metadata"]["labels"] = copy.deepcopy((body.get("metadata") or {}).get("labels"))
        return self._update(api_version, plural, cur, new)

    def _update(self, api_version: str, plural: str, cur: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        info = self._info(api_version, plural)
        if new.get("spec") != cur.get("spec"):
            new["metadata"]["generation"] = int(cur["metadata"].get("generation") or 1) + 1
        if info.validate is not None:
            causes = info.validate(new, cur)
            if causes:
                raise _status(422, f"invalid {plural}: {causes}")
        md = new["metadata"]
        if md.get("deletionTimestamp") and not md.get("finalizers"):
            self._remove(api_version, plural, new)
            return copy.deepcopy(new)
        return self._store(api_version, plural, new, "MODIFIED")

    async def patch(self, api_version: str, plural: str, name: str, patch: Any,
                    content_type: str = MERGE_PATCH, namespace: str | None = None, *,
                    subresource: str | None = None, **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("patch", plural)
        self.calls.append(("patch", plural, name))
        cur = self._bucket(api_version, plural).get(f"{namespace}/{name}")
        if cur is None:
            raise _status(404, f'{plural} "{name}" not found')
        if content_type == STRATEGIC_MERGE_PATCH:
            new = strategic_merge_patch(cur, patch, self._info(api_version, plural).strategic_schema())
        elif content_type == JSON_PATCH:
            try:
                new = json_patch(copy.deepcopy(cur), patch)
            except Invalid as e:  # a failed `test`: the API server's 422
                raise _status(422, str(e)) from None
        else:
            new = json_merge_patch(copy.deepcopy(cur), patch)
        if subresource != "status":
            new["status"] = copy.deepcopy(cur.get("status"))
        for f in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if f in cur["metadata"]:
                new["metadata"][f] = cur["metadata"][f]
        return self._update(api_version, plural, cur, new)

    async def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None, *,
                     body: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        """Finalizers hold an object (deletionTimestamp set); a pod is deleted as if
        its node stopped it at once (the agent's final gracePeriodSeconds=0 delete)."""
        await trio.lowlevel.checkpoint()
        self._maybe_fail("delete", plural)
        self.calls.append(("delete", plural, name))
        cur = self._bucket(api_version, plural).get(f"{namespace}/{name}")
        if cur is None:
            raise _status(404, f'{plural} "{name}" not found')
        pre = (body or {}).get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != cur["metadata"].get("uid"):
            raise _status(409, "the UID precondition did not match")
        self.last_delete_options = dict(body or {})
        if cur["metadata"].get("finalizers"):
            if not cur["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(cur)
                new["metadata"]["deletionTimestamp"] = ts(wall())
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                self._store(api_version, plural, new, "MODIFIED")
            return copy.deepcopy(self._bucket(api_version, plural)[f"{namespace}/{name}"])
        self._remove(api_version, plural, copy.deepcopy(cur))
        return {}

    async def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                         **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self.calls.append(("get", plural, name))
        obj = self.get(api_version, plural, namespace or "", name)
        if obj is None:
            raise _status(404, f'{plural} "{name}" not found')
        return obj

    # -- what a node would do ---------------------------------------------------------------
    def set_pod_phase(self, namespace: str, name: str, phase: str, *, exit_code: int | None = None,
                      ready: bool = False, conditions: list[dict[str, Any]] | None = None,
                      restarts: int = 0) -> dict[str, Any]:
        """Write a pod's status as its node would (Running, or finished with an exit code)."""
        cur = self._bucket("v1", "pods")[f"{namespace}/{name}"]
        new = copy.deepcopy(cur)
        now = ts(wall())
        containers = (new.get("spec") or {}).get("containers") or []
        if phase in ("Succeeded", "Failed"):
            code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
            state: dict[str, Any] = {"terminated": {"exitCode": code, "finishedAt": now, "startedAt": now,
                                                    "reason": "Completed" if code == 0 else "Error"}}
        else:
            state = {"running": {"startedAt": now}}
        conds = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now}]
        conds += conditions or []
        new["status"] = {"phase": phase, "conditions": conds, "containerStatuses": [
            {"name": c.get("name"), "state": state, "ready": ready, "restartCount": restarts}
            for c in containers]}
        return self._store("v1", "pods", new, "MODIFIED")

    def pods(self, namespace: str = "default") -> list[dict[str, Any]]:
        return self.list("v1", "pods", namespace)

    def job(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.get("batch/v1", "jobs", namespace, name)

    def add(self, api_version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create synchronously (test set-up); runs defaulting like the API server."""
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        md.setdefault("namespace", "default")
        md["uid"] = f"uid-{next(self._uid)}"
        md.setdefault("creationTimestamp", ts(wall()))
        md["generation"] = 1
        info = self._info(api_version, plural)
        if info.default is not None:
            info.default(obj)
        causes = info.validate(obj, None) if info.validate is not None else []
        assert not causes, causes
        return self._store(api_version, plural, obj, "ADDED")

    def update(self, api_version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace synchronously (test edits: suspend, parallelism, ...)."""
        md = obj["metadata"]
        cur = self._bucket(api_version, plural)[f"{md.get('namespace', 'default')}/{md['name']}"]
        new = copy.deepcopy(obj)
        new["status"] = copy.deepcopy(cur.get("status"))
        return self._update(api_version, plural, cur, new)
