"""Generate fleet/api/k8s_schema.json from the official `kubernetes` Python client's models.

The client's models are generated from Kubernetes' own OpenAPI document, so
their `openapi_types` / `attribute_map` tables are a faithful, offline copy
of the field names and types of every built-in kind.  Fleet uses the result
for strict field validation (`fieldValidation=Strict`) and to serve
`/openapi/v3` (which `kubectl apply` and `kubectl explain` read).

The Gateway API kinds are not in the client: their tables are hand-written in
packaging/gateway_api_types.py (same format) and merged in here.

Run: python packaging/gen_k8s_schema.py   (needs the `kubernetes` package)
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

from gateway_api_types import EXTERNAL_REFS as GATEWAY_EXTERNAL_REFS
from gateway_api_types import ROOTS as GATEWAY_ROOTS
from gateway_api_types import TYPES as GATEWAY_TYPES
from kubernetes.client import models

ROOTS = {
    # (group, version, kind): model class name
    ("", "v1", "Namespace"): "V1Namespace",
    ("", "v1", "Pod"): "V1Pod",
    ("", "v1", "Node"): "V1Node",
    ("", "v1", "Service"): "V1Service",
    ("", "v1", "Endpoints"): "V1Endpoints",
    ("", "v1", "ConfigMap"): "V1ConfigMap",
    ("", "v1", "Secret"): "V1Secret",
    ("", "v1", "ServiceAccount"): "V1ServiceAccount",
    ("", "v1", "Event"): "CoreV1Event",
    ("", "v1", "Binding"): "V1Binding",
    ("", "v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("", "v1", "PersistentVolume"): "V1PersistentVolume",
    ("", "v1", "ResourceQuota"): "V1ResourceQuota",
    ("", "v1", "LimitRange"): "V1LimitRange",
    ("", "v1", "PodTemplate"): "V1PodTemplate",
    ("", "v1", "ReplicationController"): "V1ReplicationController",
    ("events.k8s.io", "v1", "Event"): "EventsV1Event",
    ("coordination.k8s.io", "v1", "Lease"): "V1Lease",
    ("scheduling.k8s.io", "v1", "PriorityClass"): "V1PriorityClass",
    ("apps", "v1", "Deployment"): "V1Deployment",
    ("apps", "v1", "ReplicaSet"): "V1ReplicaSet",
    ("apps", "v1", "StatefulSet"): "V1StatefulSet",
    ("apps", "v1", "DaemonSet"): "V1DaemonSet",
    ("apps", "v1", "ControllerRevision"): "V1ControllerRevision",
    ("batch", "v1", "Job"): "V1Job",
    ("batch", "v1", "CronJob"): "V1CronJob",
    ("autoscaling", "v1", "Scale"): "V1Scale",
    ("meta.k8s.io", "v1", "DeleteOptions"): "V1DeleteOptions",
    ("policy", "v1", "Eviction"): "V1Eviction",
    ("policy", "v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("autoscaling", "v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("discovery.k8s.io", "v1", "EndpointSlice"): "V1EndpointSlice",
    ("networking.k8s.io", "v1", "IPAddress"): "V1IPAddress",
    ("networking.k8s.io", "v1", "ServiceCIDR"): "V1ServiceCIDR",
    ("networking.k8s.io", "v1", "Ingress"): "V1Ingress",
    ("networking.k8s.io", "v1", "IngressClass"): "V1IngressClass",
    ("networking.k8s.io", "v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("storage.k8s.io", "v1", "StorageClass"): "V1StorageClass",
    ("storage.k8s.io", "v1", "VolumeAttachment"): "V1VolumeAttachment",
    ("storage.k8s.io", "v1", "CSIDriver"): "V1CSIDriver",
    ("storage.k8s.io", "v1", "CSINode"): "V1CSINode",
    ("storage.k8s.io", "v1", "CSIStorageCapacity"): "V1CSIStorageCapacity",
    ("rbac.authorization.k8s.io", "v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("certificates.k8s.io", "v1", "CertificateSigningRequest"): "V1CertificateSigningRequest",
    ("authentication.k8s.io", "v1", "TokenReview"): "V1TokenReview",
    ("authentication.k8s.io", "v1", "TokenRequest"): "AuthenticationV1TokenRequest",
    ("authentication.k8s.io", "v1", "SelfSubjectReview"): "V1SelfSubjectReview",
    ("authorization.k8s.io", "v1", "SubjectAccessReview"): "V1SubjectAccessReview",
    ("authorization.k8s.io", "v1", "SelfSubjectAccessReview"): "V1SelfSubjectAccessReview",
    ("authorization.k8s.io", "v1", "LocalSubjectAccessReview"): "V1LocalSubjectAccessReview",
    ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration"): "V1MutatingWebhookConfiguration",
    ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration"):
        "V1ValidatingWebhookConfiguration",
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy"): "V1ValidatingAdmissionPolicy",
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding"):
        "V1ValidatingAdmissionPolicyBinding",
    ("authorization.k8s.io", "v1", "SelfSubjectRulesReview"): "V1SelfSubjectRulesReview",
    ("apiregistration.k8s.io", "v1", "APIService"): "V1APIService",
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition"): "V1CustomResourceDefinition",
}

SCALARS = {"str": "string", "int": "integer", "bool": "boolean", "float": "number",
           "datetime": "date-time", "date": "date", "object": "any",
           "bytes": "byte"}


def parse_type(t: str, todo: list[str]):
    t = t.strip()
    if t in SCALARS:
        return SCALARS[t]
    m = re.fullmatch(r"(?:List|list)\[(.*)\]", t)
    if m:
        return {"list": parse_type(m.group(1), todo)}
    m = re.fullmatch(r"(?:Dict|dict)\(?\[?str, (.*?)[\])]", t)
    if m:
        return {"map": parse_type(m.group(1), todo)}
    todo.append(t)
    return {"ref": t}


def describe(cls, attr: str) -> str:
    # The models are pydantic classes whose field descriptions come from the OpenAPI document.
    field = getattr(cls, "model_fields", {}).get(attr)
    return (field.description or "") if field is not None else ""


def _refs(expr) -> list[str]:
    if isinstance(expr, str):
        return []
    if "ref" in expr:
        return [expr["ref"]]
    return _refs(expr.get("list") or expr.get("map"))


def main() -> None:
    types: dict[str, dict] = dict(GATEWAY_TYPES)
    todo = list(ROOTS.values()) + list(GATEWAY_EXTERNAL_REFS)
    while todo:
        name = todo.pop()
        if name in types:
            continue
        cls = getattr(models, name)
        fields = {}
        for attr, typ in cls.openapi_types.items():
            json_name = cls.attribute_map[attr]
            fields[json_name] = {"type": parse_type(typ, todo), "description": describe(cls, attr)}
        doc = (inspect.getdoc(cls) or "").split("Attributes:")[0]
        types[name] = {"fields": fields, "description": " ".join(doc.split())}
    missing = sorted({r for t in GATEWAY_TYPES.values() for fld in t["fields"].values()
                      for r in _refs(fld["type"])} - set(types))
    if missing:
        raise SystemExit(f"gateway_api_types.py refers to unknown types: {missing}")
    roots = [{"group": g, "version": v, "kind": k, "type": t}
             for (g, v, k), t in {**ROOTS, **GATEWAY_ROOTS}.items()]
    out = {"roots": roots, "types": dict(sorted(types.items()))}
    path = Path(__file__).resolve().parent.parent / "fleet" / "api" / "k8s_schema.json"
    path.write_text(json.dumps(out, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {path} ({len(types)} types, {path.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
