"""Owner references: read them, build them, claim objects with them (pure, no I/O).

Every workload controller (ReplicaSet, Deployment, StatefulSet, DaemonSet, Job,
CronJob), the disruption controller, the drain runner, the scheduler and the
printers ask the same questions about `metadata.ownerReferences`, so they are
answered once here, as apimachinery and client-go answer them:

* `controller_of` reads the reference with `controller: true`
  (metav1.GetControllerOf); `controller_ref` builds the one a controller puts on
  what it creates (metav1.NewControllerRef: `controller` and
  `blockOwnerDeletion` true).
* `claim` is the decision of client-go's `BaseControllerRefManager.ClaimObject`:
  an owner keeps the objects naming it as controller while its selector matches
  them, releases the ones it no longer matches (unless it is being deleted), and
  adopts matching orphans — never while it is being deleted, never an object
  that is being deleted.  Objects another controller owns are none of its
  business.  (Kubernetes also re-reads the owner before the first adoption, to
  be sure it is not being deleted; that read is the caller's, since it is I/O.)
* `adopt_patch` / `release_patch` are the writes that carry a claim out: JSON
  patches (RFC 6902) whose first operations `test` the object's uid and
  resourceVersion, so that a patch computed from a stale copy fails (422) and
  the caller re-reads instead of, say, two controllers both adopting one pod.
  Adopting an object another controller already owns is refused
  (`AlreadyControlled`) before any request, as the API server would refuse an
  object with two controllers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Obj = Mapping[str, Any]


class AlreadyControlled(Exception):
    """The object already has a controller other than the would-be adopter."""

    def __init__(self, obj: Obj, controller: Mapping[str, Any]) -> None:
        md = _md(obj)
        super().__init__(f"{obj.get('kind') or 'object'} {md.get('namespace') or ''}/{md.get('name') or ''} "
                         f"is already controlled by {controller.get('kind')} {controller.get('name')} "
                         f"(uid {controller.get('uid')})")
        self.controller = dict(controller)


def _md(obj: Obj) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def _refs(obj: Obj) -> list[Any]:
    refs = _md(obj).get("ownerReferences")
    return refs if isinstance(refs, list) else []


def controller_of(obj: Obj) -> dict[str, Any] | None:
    """metav1.GetControllerOf: the owner reference with `controller: true`, if any."""
    for ref in _refs(obj):
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def is_controlled_by(obj: Obj, owner_uid: str) -> bool:
    """Whether `obj`'s controller is the object with uid `owner_uid`."""
    ref = controller_of(obj)
    return ref is not None and str(ref.get("uid")) == owner_uid


def controller_ref(owner: Obj, *, block_owner_deletion: bool = True, api_version: str | None = None,
                   kind: str | None = None) -> dict[str, Any]:
    """metav1.NewControllerRef: the reference `owner` puts on what it creates or adopts.

    `api_version`/`kind` default to the owner's own; controllers pass theirs
    (`apps/v1`, `ReplicaSet`), as Kubernetes' controllers pass their
    controllerKind, because objects read from a list need not carry them.
    """
    md = _md(owner)
    api_version = api_version or owner.get("apiVersion")
    kind = kind or owner.get("kind")
    if not api_version or not kind:
        raise ValueError("controller_ref: the owner's apiVersion and kind are needed")
    return {"apiVersion": api_version, "kind": kind, "name": md.get("name"), "uid": md.get("uid"),
            "controller": True, "blockOwnerDeletion": block_owner_deletion}


def orphan_namespace(obj: Obj) -> list[str]:
    """Informer index: the namespace of an object no controller owns (adoption candidates),
    so a controller finds orphans without walking every object of the namespace."""
    return [str(_md(obj).get("namespace") or "")] if controller_of(obj) is None else []


def claim(owner: Obj, candidates: Iterable[Obj], matches: Callable[[Any], bool]
          ) -> tuple[list[Any], list[Any], list[Any]]:
    """ControllerRefManager.ClaimObject over `candidates`: (owned, to_adopt, to_release).

    Owned objects that still match stay owned; owned ones that do not are to be
    released — unless the owner is being deleted, when they are neither owned
    nor released.  Matching orphans are to be adopted, unless the owner or the
    orphan is being deleted.  Objects controlled by another owner are skipped.
    """
    uid = str(_md(owner).get("uid") or "")
    deleting = bool(_md(owner).get("deletionTimestamp"))
    owned: list[Any] = []
    adopt: list[Any] = []
    release: list[Any] = []
    for obj in candidates:
        ref = controller_of(obj)
        if ref is not None:
            if str(ref.get("uid")) != uid:
                continue
            if matches(obj):
                owned.append(obj)
            elif not deleting:
                release.append(obj)
            continue
        if deleting or _md(obj).get("deletionTimestamp") or not matches(obj):
            continue
        adopt.append(obj)
    return owned, adopt, release


def _guards(obj: Obj) -> list[dict[str, Any]]:
    """`test` operations pinning the object we computed the patch from."""
    md = _md(obj)
    uid, rv = md.get("uid"), md.get("resourceVersion")
    if not uid or not rv:
        raise ValueError("an adoption or release patch needs the object's uid and resourceVersion")
    return [{"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv}]


def adopt_patch(obj: Obj, owner: Obj, *, api_version: str | None = None, kind: str | None = None,
                finalizers: Sequence[str] = ()) -> list[dict[str, Any]]:
    """A JSON patch making `owner` the controller of `obj`, valid only for the copy we saw.

    A non-controller reference to the same owner is replaced (as the strategic
    merge by uid Kubernetes sends would do); `finalizers` not yet on the object
    are added with the reference (the Job controller's tracking finalizer).
    Raises AlreadyControlled when another controller owns `obj`.
    """
    ref = controller_ref(owner, api_version=api_version, kind=kind)
    current = controller_of(obj)
    if current is not None and str(current.get("uid")) != str(ref["uid"]):
        raise AlreadyControlled(obj, current)
    ops = _guards(obj)
    refs = _refs(obj)
    same = [i for i, r in enumerate(refs) if isinstance(r, dict) and str(r.get("uid")) == str(ref["uid"])]
    if same:
        ops.append({"op": "replace", "path": f"/metadata/ownerReferences/{same[0]}", "value": ref})
    elif refs:
        ops.append({"op": "add", "path": "/metadata/ownerReferences/-", "value": ref})
    else:
        ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": [ref]})
    have = _md(obj).get("finalizers")
    have = have if isinstance(have, list) else []
    missing = [f for f in dict.fromkeys(finalizers) if f not in have]
    if missing and have:
        ops += [{"op": "add", "path": "/metadata/finalizers/-", "value": f} for f in missing]
    elif missing:
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": missing})
    return ops


def release_patch(obj: Obj, owner: Obj) -> list[dict[str, Any]]:
    """A JSON patch removing every reference to `owner` from `obj`, valid only for the copy
    we saw (the field goes when nothing is left, as Kubernetes omits an empty list)."""
    ops = _guards(obj)
    uid = str(_md(owner).get("uid"))
    refs = _refs(obj)
    keep = [r for r in refs if not (isinstance(r, dict) and str(r.get("uid")) == uid)]
    if len(keep) == len(refs):
        return ops  # nothing of ours: the guards alone, a write that changes nothing
    if keep:
        ops.append({"op": "replace", "path": "/metadata/ownerReferences", "value": keep})
    else:
        ops.append({"op": "remove", "path": "/metadata/ownerReferences"})
    return ops
