"""CustomResourceDefinition schemas: a pure library (no I/O) the API server calls.

- `structural_violations(schema, path)`: is the openAPIV3Schema acceptable (structural,
  CRD schema rules, defaults valid and pruned)?  `schema_violations` adds the CEL
  rules' compilation and cost guard (rules.py) — everything a CRD create/update checks
  about one version's schema.
- On a custom resource write, in kube-apiserver's order: `prune` (unknown fields, the
  pruned paths for fieldValidation warnings) → `apply_defaults` → `validate` (OpenAPI
  value validation) + `embedded_violations` (TypeMeta/ObjectMeta of embedded
  resources) + `list_violations` (duplicates in sets and map lists) + `validate_rules` (x-kubernetes-validations, with `old` on update).
  `validate_custom_resource` runs the three validations.
"""

from __future__ import annotations

from typing import Any

from fleet.api.crd.defaults import apply_defaults
from fleet.api.crd.listtype import list_violations
from fleet.api.crd.objectmeta import embedded_violations, validate_embedded
from fleet.api.crd.prune import prune, strict_decoding_message, unknown_field_warnings
from fleet.api.crd.rules import estimated_cost, rule_violations, validate_rules
from fleet.api.crd.structural import default_violations, structural_violations
from fleet.api.crd.validate import validate
from fleet.api.errors import cause
from fleet.api.validation import Cause

# Field errors after which kube-apiserver does not run the CEL rules (NotSupported, Required,
# TooLong, TooMany, TypeInvalid).
BLOCKING_REASONS = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
                              "FieldValueTooMany", "FieldValueTypeInvalid"})


def schema_violations(schema: Any, path: str = "spec.validation.openAPIV3Schema") -> list[Cause]:
    """Everything kube-apiserver refuses about one openAPIV3Schema; CEL rules are compiled
    only once the schema itself is sound (as kube: their errors would not be actionable)."""
    out = structural_violations(schema, path)
    if not out:
        out = rule_violations(schema, path)
    return out


def validate_custom_resource(obj: dict[str, Any], schema: dict[str, Any], old: dict[str, Any] | None = None
                             ) -> list[Cause]:
    """Schema, embedded-resource and CEL-rule causes for a pruned, defaulted custom resource."""
    out = validate(obj, schema, "")
    out.extend(embedded_violations(obj, schema))
    out.extend(list_violations(obj, schema))
    if any(c.get("reason") in BLOCKING_REASONS for c in out):
        # kube's hasBlockingErr: the rules would read values of the wrong shape; one fieldless note instead.
        out.append(cause("<nil>", 'Invalid value: "null": some validation rules were not checked because the '
                                  'object was invalid; correct the existing errors to complete validation'))
    else:
        out.extend(validate_rules(obj, schema, old))
    return out


__all__ = ["apply_defaults", "default_violations", "embedded_violations", "estimated_cost", "list_violations", "prune",
           "rule_violations", "schema_violations", "strict_decoding_message", "structural_violations",
           "unknown_field_warnings", "validate", "validate_custom_resource", "validate_embedded", "validate_rules"]
