"""`coordination.k8s.io/v1` Lease: the object leader election and node heartbeats write.

Leases are written several times a second across a cluster, by Fleet's own
components and by client-go based tools (kube leader election), so the
validation checks exactly the field shapes those writers rely on and nothing
slower.
"""

from __future__ import annotations

from typing import Any

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.kinds._common import col, d
from fleet.api.registry import KindInfo

Cause = dict[str, str]


def validate_lease(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if spec is None:
        return out
    if not isinstance(spec, dict):
        return out + [v.type_invalid("spec", spec, "object")]
    for key in ("holderIdentity", "strategy", "preferredHolder"):
        val = spec.get(key)
        if val is not None and not isinstance(val, str):
            out.append(v.type_invalid(f"spec.{key}", val, "string"))
    v.positive(spec, "leaseDurationSeconds", "spec.leaseDurationSeconds", out)
    v.nonnegative(spec, "leaseTransitions", "spec.leaseTransitions", out)
    for key in ("acquireTime", "renewTime"):
        val = spec.get(key)
        if val is None:
            continue
        ok = isinstance(val, str)
        if ok:
            try:
                meta.parse_rfc3339(val)
            except ValueError:
                ok = False
        if not ok:
            out.append(v.invalid(f"spec.{key}", val, "must be an RFC 3339 timestamp (MicroTime)"))
    return out


LEASE = KindInfo(
    group="coordination.k8s.io", version="v1", kind="Lease", plural="leases", singular="lease",
    columns=(col("Holder", lambda o: d(o, "spec").get("holderIdentity") or "",
                 description="holderIdentity contains the identity of the holder of a current lease."),),
    validate=validate_lease,
)

KINDS = (LEASE,)
