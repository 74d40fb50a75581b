"""CustomResourceDefinitions served for real: names, establishing, the live registry, cleanup.

apiextensions-apiserver's NamingConditionController, EstablishingController and
CRDFinalizer in one controller of the server process (a `QueueWorker` over a CRD
informer, run by its own `Manager` with the server's client), plus the registrar that
puts the CRD's kinds into the server's live `Registry` — the one REST, discovery,
OpenAPI and tables read, so custom resources are served by the same generic code as
built-in kinds.

- `names_plan` (pure): the accepted names and the NamesAccepted / Established
  conditions in kube's words (`NoConflicts` / `"<name>" is already in use` with
  `PluralConflict`, `SingularConflict`, `ShortNamesConflict`, `KindConflict`,
  `ListKindConflict`; Established `NotAccepted`, `Installing`, `InitialNamesAccepted`).
  Names are checked against the other CRDs of the group (kube) and against the
  built-in kinds of the group (Fleet: kube cannot serve those either).
- `Registrar`: one KindInfo per served version (fleet/api/crd/resource.py) for an
  Established CRD, replaced on every change and removed when the CRD goes; a
  terminating CRD's kinds refuse `create` (kube: 405 while terminating).
  `register_stored` does it at server start, before the API serves.
- Deletion: the CRD's DELETE only marks it with the `customresourcecleanup` finalizer
  and a `Terminating` condition (crd_delete.py); this controller then deletes every
  custom resource (their own finalizers honoured: it waits until none is left) and
  removes the finalizer, so the store deletes the CRD last.
"""

from __future__ import annotations

import copy
import logging
from functools import partial
from typing import Any

from fleet.api import meta
from fleet.api.conditions import find, set_status_condition
from fleet.api.crd.resource import kinds_for, storage_version
from fleet.api.kinds.apiextensions import API_VERSION, FINALIZER
from fleet.api.registry import KindInfo, Registry
from fleet.client import ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer
from fleet.server import crd_conversion
from fleet.store import Store

log = logging.getLogger(__name__)

PLURAL = "customresourcedefinitions"
NAMES_ACCEPTED = "NamesAccepted"
ESTABLISHED = "Established"
TERMINATING = "Terminating"
CREATE_FORBIDDEN_VERBS = ("create",)


def _names(crd: dict[str, Any], where: str) -> dict[str, Any]:
    src = (crd.get(where) or {})
    n = src.get("acceptedNames") if where == "status" else src.get("names")
    return n if isinstance(n, dict) else {}


def used_names(crd: dict[str, Any], others: list[dict[str, Any]], builtin: list[KindInfo]
               ) -> tuple[set[str], set[str]]:
    """(resources, kinds) already claimed in `crd`'s group by other CRDs and built-in kinds."""
    group = (crd.get("spec") or {}).get("group")
    name = (crd.get("metadata") or {}).get("name")
    resources: set[str] = set()
    kinds: set[str] = set()
    for o in others:
        if (o.get("metadata") or {}).get("name") == name or (o.get("spec") or {}).get("group") != group:
            continue
        acc = _names(o, "status")
        resources.update(x for x in (acc.get("plural"), acc.get("singular"), *(acc.get("shortNames") or []))
                         if isinstance(x, str) and x)
        kinds.update(x for x in (acc.get("kind"), acc.get("listKind")) if isinstance(x, str) and x)
    for info in builtin:
        if info.group == group:
            resources.update((info.plural, info.singular, *info.short_names))
            kinds.update((info.kind, info.list_kind))
    return resources, kinds


def _fresh(requested: Any, accepted: Any, used: set[str]) -> str | None:
    """equalToAcceptedOrFresh: an error text, or None."""
    if requested == accepted or requested not in used:
        return None
    return f'"{requested}" is already in use'


def names_plan(crd: dict[str, Any], others: list[dict[str, Any]], builtin: list[KindInfo], now: str
               ) -> dict[str, Any]:
    """The status `crd` should have: acceptedNames and the NamesAccepted/Established
    conditions (NamingConditionController.calculateNamesAndConditions + establishing)."""
    resources, kinds = used_names(crd, others, builtin)
    req, acc = _names(crd, "spec"), _names(crd, "status")
    new = dict(acc)
    status, reason, message = "Unknown", "", ""

    def conflict(r: str, m: str) -> None:
        nonlocal status, reason, message
        status, reason, message = "False", r, m

    for field, r, used in (("plural", "PluralConflict", resources), ("singular", "SingularConflict", resources)):
        err = _fresh(req.get(field), acc.get(field), used)
        if err:
            conflict(r, err)
        elif req.get(field) is not None:
            new[field] = req.get(field)
    if list(req.get("shortNames") or []) != list(acc.get("shortNames") or []):
        mine = set(acc.get("shortNames") or [])
        errs = [e for s in req.get("shortNames") or [] if s not in mine for e in [_fresh(s, "", resources)] if e]
        if errs:
            conflict("ShortNamesConflict", errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
        else:
            new["shortNames"] = list(req.get("shortNames") or [])
            if not new["shortNames"]:
                new.pop("shortNames")
    for field, r in (("kind", "KindConflict"), ("listKind", "ListKindConflict")):
        err = _fresh(req.get(field), acc.get(field), kinds)
        if err:
            conflict(r, err)
        elif req.get(field) is not None:
            new[field] = req.get(field)
    if req.get("categories"):
        new["categories"] = list(req["categories"])
    else:
        new.pop("categories", None)
    if status == "Unknown":
        status, reason, message = "True", "NoConflicts", "no conflicts found"
    conds = (crd.get("status") or {}).get("conditions")
    conds = set_status_condition(conds, NAMES_ACCEPTED, status, reason, message, now)
    est = find(conds, ESTABLISHED)
    if status == "True":
        # The names are ours: kube's establishing controller marks the CRD served.
        if est is None or est.get("status") != "True":
            conds = set_status_condition(conds, ESTABLISHED, "True", "InitialNamesAccepted",
                                         "the initial names have been accepted", now)
    elif est is None:
        conds = set_status_condition(conds, ESTABLISHED, "False", "NotAccepted", "not all names are accepted", now)
    out = copy.deepcopy(crd.get("status") or {})
    out["acceptedNames"] = new
    out["conditions"] = conds
    sv = storage_version(crd)
    stored = list(out.get("storedVersions") or [])
    if sv and sv not in stored:
        stored.append(sv)
    out["storedVersions"] = stored
    return out


def established(crd: dict[str, Any]) -> bool:
    c = find((crd.get("status") or {}).get("conditions"), ESTABLISHED)
    return c is not None and c.get("status") == "True"


def terminating(crd: dict[str, Any]) -> bool:
    return bool((crd.get("metadata") or {}).get("deletionTimestamp"))


class Registrar:
    """The CRDs' kinds in the server's live registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.served: dict[str, list[tuple[str, str, str]]] = {}  # CRD name -> its (group, version, plural)s
        self.generation = 0  # bumped on every change (caches keyed on it rebuild)
        self.stamps: dict[str, tuple[Any, bool, bool]] = {}  # CRD name -> what `sync` last served

    def sync(self, crd: dict[str, Any]) -> None:
        """Serve `crd`'s versions as it says now (nothing unless Established)."""
        name = str((crd.get("metadata") or {}).get("name") or "")
        stamp = ((crd.get("metadata") or {}).get("resourceVersion"), terminating(crd), established(crd))
        if stamp[0] is not None and self.stamps.get(name) == stamp:
            return  # already serving this revision (fresh entries would only invalidate caches)
        self.stamps[name] = stamp
        self.remove(name)
        if not established(crd):
            return
        keys = []
        for info in kinds_for(crd):
            info.source = crd
            info.convert = partial(crd_conversion.convert, crd)
            if terminating(crd):
                info.verbs = tuple(v for v in info.verbs if v not in CREATE_FORBIDDEN_VERBS)
            self.registry.register(info)
            keys.append((info.group, info.version, info.plural))
        self.served[name] = keys
        self.generation += 1

    def forget(self, name: str) -> None:
        """The CRD is gone: its kinds leave the registry."""
        self.stamps.pop(name, None)
        self.remove(name)

    def remove(self, name: str) -> None:
        for g, v, p in self.served.pop(name, []):
            self.registry.unregister(g, v, p)
            self.generation += 1


async def register_stored(store: Store, registrar: Registrar) -> int:
    """At start, before the API serves: the stored Established CRDs' kinds."""
    items = (await store.list(meta.store_key("apiextensions.k8s.io", PLURAL, None, None))).items
    for crd in items:
        registrar.sync(crd)
    return len(items)


class CRDController(QueueWorker):
    name = "customresourcedefinition"
    kind = "CustomResourceDefinition"
    workers = 2

    def __init__(self, registrar: Registrar) -> None:
        super().__init__()
        self.registrar = registrar
        self.builtin = [i for i in registrar.registry.all() if i.source is None]

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.crds: SharedInformer = ctx.informers.informer(API_VERSION, PLURAL)

        def changed(_t: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            # A CRD's names free or take names of the others in its group.
            self.enqueue(new or old)
            for o in self.crds.list():
                self.enqueue(o)

        self.crds.add_handler(changed)

    async def reconcile(self, key: str) -> float | None:
        crd = self.crds.get(key)
        name = key.rpartition("/")[2]
        if crd is None:
            self.registrar.forget(name)
            return None
        if terminating(crd):
            self.registrar.sync(crd)
            return await self._finalize(crd)
        want = names_plan(crd, self.crds.list(), self.builtin, meta.now_rfc3339())
        if _same_status(want, crd.get("status") or {}):
            self.registrar.sync(crd)
            return None
        body = copy.deepcopy(crd)
        body["status"] = want
        try:
            stored = await self.ctx.client.replace(API_VERSION, PLURAL, name, body, subresource="status")
        except ApiException as e:
            if e.code == 404:
                self.registrar.forget(name)
                return None
            if e.code == 409:
                return 0.05
            raise
        self.registrar.sync(stored)
        return None

    async def _finalize(self, crd: dict[str, Any]) -> float | None:
        """CRDFinalizer: delete every instance, wait until none is left, drop the finalizer."""
        name = crd["metadata"]["name"]
        if FINALIZER not in (crd["metadata"].get("finalizers") or []):
            return None
        spec = crd.get("spec") or {}
        plural = (_names(crd, "status").get("plural") or (spec.get("names") or {}).get("plural"))
        version = storage_version(crd)
        left = 0
        if established(crd) and version:
            api_version = f"{spec.get('group')}/{version}"
            items = (await self.ctx.client.list_all(api_version, plural)).get("items") or []
            left = len(items)
            for obj in items:
                md = obj.get("metadata") or {}
                if md.get("deletionTimestamp"):
                    continue
                try:
                    await self.ctx.client.delete(api_version, plural, md["name"], md.get("namespace"))
                except ApiException as e:
                    if e.code != 404:
                        raise
        if left:
            await self._condition(crd, "True", "InstanceDeletionInProgress", "CustomResource deletion is in progress")
            return 0.2
        await self._condition(crd, "False", "InstanceDeletionCompleted", "removed all instances")
        fresh = await self.ctx.client.get_object(API_VERSION, PLURAL, name)
        fresh["metadata"]["finalizers"] = [f for f in fresh["metadata"].get("finalizers") or [] if f != FINALIZER]
        try:
            await self.ctx.client.replace(API_VERSION, PLURAL, name, fresh)
        except ApiException as e:
            if e.code == 409:
                return 0.05
            if e.code != 404:
                raise
        return None

    async def _condition(self, crd: dict[str, Any], status: str, reason: str, message: str) -> None:
        cur = find((crd.get("status") or {}).get("conditions"), TERMINATING)
        if cur is not None and (cur.get("status"), cur.get("reason")) == (status, reason):
            return
        body = copy.deepcopy(crd)
        st = body.setdefault("status", {})
        st["conditions"] = set_status_condition(st.get("conditions"), TERMINATING, status, reason, message,
                                                meta.now_rfc3339())
        try:
            await self.ctx.client.replace(API_VERSION, PLURAL, crd["metadata"]["name"], body, subresource="status")
        except ApiException as e:
            if e.code not in (404, 409):
                raise


def delete_strategy(rest: Any) -> Any:
    """The CRD's DELETE (kube's customresourcedefinition REST.Delete): the object is only
    marked — deletionTimestamp, the `customresourcecleanup` finalizer and a Terminating
    condition — and the controller deletes it once its custom resources are gone."""

    async def delete(info: KindInfo, route: Any, old: dict[str, Any], opts: dict[str, Any], *,
                     dry_run: bool) -> Any:
        from fleet.server import deletion
        from fleet.server.http import Resp
        from fleet.server.request_params import warning_headers

        cur = copy.deepcopy(old)
        if not cur["metadata"].get("deletionTimestamp"):
            fins = list(cur["metadata"].get("finalizers") or [])
            if FINALIZER not in fins:
                cur["metadata"]["finalizers"] = [*fins, FINALIZER]

        def mark(obj: dict[str, Any]) -> None:
            st = obj.setdefault("status", {})
            st["conditions"] = set_status_condition(
                st.get("conditions"), TERMINATING, "True", "InstanceDeletionPending",
                "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
                meta.now_rfc3339())

        obj, code = await rest.delete_object(info, route, cur, opts, dry_run=dry_run, mark=mark)
        return Resp.json(code, obj, warning_headers(deletion.warnings_for(info, opts)))

    return delete


def _same_status(want: dict[str, Any], have: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any]) -> Any:
        return {**s, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                    for c in s.get("conditions") or [] if isinstance(c, dict)]}
    return bool(strip(want) == strip(have))


__all__ = ["CRDController", "Registrar", "delete_strategy", "established", "names_plan", "register_stored", "used_names"]
