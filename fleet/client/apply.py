"""Client-side apply, the way `kubectl apply` does it by default.

An applied object remembers what the user last applied in the annotation
`kubectl.kubernetes.io/last-applied-configuration` (compact JSON of the
object as given, without that annotation).  Applying again computes a
three-way patch from that memory (original), the new manifest (modified) and
the live object (current): fields the user dropped from the manifest are
deleted, fields other writers set (status, defaults, a controller's labels)
are left alone.  Built-in kinds get a strategic merge patch (keyed lists such
as containers merge by name); other kinds a JSON merge patch, because servers
refuse strategic merge for custom resources.  A 409 (someone wrote in
between) re-reads the live object and recomputes the patch.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from fleet.client.discovery import APIResource
from fleet.client.rest import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiException, Client

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
FIELD_MANAGER = "kubectl-client-side-apply"


class ApplyError(Exception):
    """The object cannot be applied (no name, retries exhausted)."""


class ApplyFailed(Exception):
    """The server refused a create or a patch; says which, as kubectl's message does."""

    def __init__(self, operation: str, error: ApiException) -> None:
        super().__init__(str(error))
        self.operation = operation  # "creating" | "patching"
        self.error = error


@dataclass(frozen=True)
class ApplyResult:
    resource: APIResource
    name: str
    namespace: str | None
    action: str  # "created" | "configured" | "unchanged"
    object: dict[str, Any]

    def describe(self) -> str:
        """`deployment.apps/web configured`, as kubectl prints it."""
        return f"{self.resource.kind_prefix}/{self.name} {self.action}"


def last_applied_json(obj: dict[str, Any]) -> str:
    """The annotation value: the object without the annotation, compact JSON, sorted keys.

    Like kubectl, the annotations map stays in (possibly empty) so the shape of
    the annotation matches what kubectl would have written.
    """
    clean = copy.deepcopy(obj)
    md = clean.setdefault("metadata", {})
    annotations = dict(md.get("annotations") or {})
    annotations.pop(LAST_APPLIED, None)
    md["annotations"] = annotations
    # kubectl writes it with Go's json.Encoder, which ends with a newline;
    # matching it byte for byte keeps kubectl and kfleet from seeing each
    # other's applies as changes.
    return json.dumps(clean, separators=(",", ":"), sort_keys=True) + "\n"


def with_last_applied(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` carrying its own last-applied annotation."""
    out = copy.deepcopy(obj)
    value = last_applied_json(obj)
    md = out.setdefault("metadata", {})
    md["annotations"] = {**(md.get("annotations") or {}), LAST_APPLIED: value}
    return out


def _is_builtin_group(group: str) -> bool:
    # Custom resource groups must contain a dot and may not end in k8s.io
    # without an approval annotation, so this separates built-ins from CRDs.
    return group == "" or "." not in group or group.endswith(".k8s.io")


def patch_strategy(resource: APIResource) -> tuple[dict[str, Any], str]:
    """(strategic-merge schema, content type) for applying to `resource`."""
    if _is_builtin_group(resource.group):
        from fleet.api import smp_schema

        try:
            schema = smp_schema.schema_for(resource.kind)
        except (KeyError, LookupError):
            schema = None
        if schema:
            return schema, STRATEGIC_MERGE_PATCH
    return {}, MERGE_PATCH


def compute_patch(original: dict[str, Any] | None, modified: dict[str, Any],
                  current: dict[str, Any], resource: APIResource) -> tuple[dict[str, Any], str]:
    """The three-way apply patch and its content type ({} means unchanged)."""
    from fleet.api.patch import three_way_merge_patch

    schema, content_type = patch_strategy(resource)
    patch = three_way_merge_patch(original or {}, modified, current, schema)
    return patch or {}, content_type


def _original_of(live: dict[str, Any]) -> dict[str, Any] | None:
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def apply_object(client: Client, obj: dict[str, Any], namespace: str, *,
                       field_manager: str = FIELD_MANAGER, max_attempts: int = 5,
                       dry_run: bool = False) -> ApplyResult:
    """Create or three-way-patch one object; `namespace` fills in a missing one."""
    resource = await client.resource_for_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
    obj = copy.deepcopy(obj)
    md = obj.setdefault("metadata", {})
    name = md.get("name")
    if not name:
        raise ApplyError(f"{resource.kind}: metadata.name is required for apply")
    ns: str | None
    if resource.namespaced:
        ns = md.get("namespace") or namespace
        md["namespace"] = ns
    else:
        ns = None
        md.pop("namespace", None)
    modified = with_last_applied(obj)
    params: dict[str, str] = {"fieldManager": field_manager}
    if dry_run:
        params["dryRun"] = "All"

    last_error: ApiException | None = None
    for _ in range(max_attempts):
        try:
            live = await client.get_object(resource.api_version, resource.name, name, ns)
        except ApiException as exc:
            if exc.code != 404:
                raise
            try:
                created = await client.create(resource.api_version, resource.name, modified, ns,
                                              params={**params, "fieldValidation": "Strict"})
            except ApiException as create_exc:
                if create_exc.code == 409 and create_exc.reason == "AlreadyExists":
                    last_error = create_exc
                    continue  # created by someone else meanwhile: patch it instead
                raise ApplyFailed("creating", create_exc) from create_exc
            return ApplyResult(resource, name, ns, "created", created)

        patch, content_type = compute_patch(_original_of(live), modified, live, resource)
        if not patch:
            return ApplyResult(resource, name, ns, "unchanged", live)
        try:
            patched = await client.patch(resource.api_version, resource.name, name, patch,
                                         content_type, ns,
                                         params={**params, "fieldValidation": "Strict"})
        except ApiException as exc:
            if exc.code == 409:
                last_error = exc
                continue
            raise ApplyFailed("patching", exc) from exc
        return ApplyResult(resource, name, ns, "configured", patched)
    assert last_error is not None
    raise ApplyFailed("patching", last_error)
