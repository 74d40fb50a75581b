"""Field paths and value helpers shared by the CRD schema modules.

Paths are rendered as apimachinery's `field.Path` renders them: `.child`,
`[key]` for map keys and schema property names, `[0]` for indexes.
"""

from __future__ import annotations

from typing import Any

from fleet.api.typecheck import type_name_of

SCHEMA_TYPES = ("array", "boolean", "integer", "number", "object", "string")


def child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def key(path: str, k: str) -> str:
    return f"{path}[{k}]"


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def json_type(value: Any) -> str:
    """The JSON type name kube-openapi infers for a decoded value (typecheck's one reading)."""
    return type_name_of(value)


def schema_dict(value: Any) -> dict[str, Any] | None:
    """A sub-schema, or None when absent or not an object (a bool additionalProperties)."""
    return value if isinstance(value, dict) else None


def properties(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def is_true(schema: dict[str, Any], ext: str) -> bool:
    return schema.get(ext) is True
