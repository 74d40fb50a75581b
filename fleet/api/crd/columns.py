"""additionalPrinterColumns: kube's custom-resource table convertor, as pure functions.

apiextensions-apiserver's `tableconvertor.New`: a `Name` column (format `name`) first,
then the CRD version's columns in order; a version without columns gets one `Age`
column (`serveDefaultColumnsIfEmpty`: type date, `.metadata.creationTimestamp`).  A
column's description defaults to `Custom resource definition column (in JSONPath
format): <path>`.  Cells: the first JSONPath result (missing → null, which kubectl
prints `<none>`); `string` columns print the value as kubectl's JSONPath printer does
(JSON for maps and lists), `integer`/`number`/`boolean` keep JSON values of that type
only, `date` shows the time since the timestamp (kube's translateTimestampSince).

The JSONPath subset: `.a.b`, `['a.b']`, `[0]`, `[-1]`, `[*]`, `[?(@.type=="Ready")]`
(== and != on a string, number or boolean) — what CRD columns use in practice.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fleet.api import meta
from fleet.api.registry import NAME_COLUMN, Column

DEFAULT_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
               "description": "CreationTimestamp is a timestamp representing the server time when this object "
                              "was created. It is not guaranteed to be set in happens-before order across "
                              "separate operations. Clients may not set this value. It is represented in "
                              "RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for "
                              "lists. More info: https://git.k8s.io/community/contributors/devel/"
                              "sig-architecture/api-conventions.md#metadata"}

_TOKEN = re.compile(r"""\.([A-Za-z0-9_\-$]+)|\[\s*'([^']*)'\s*\]|\[\s*"([^"]*)"\s*\]|\[\s*(-?\d+)\s*\]|\[\s*\*\s*\]|\.\*"""
                    r"""|\[\?\(\s*@((?:\.[A-Za-z0-9_\-]+)+)\s*(==|!=)\s*(?:'([^']*)'|"([^"]*)"|([^)\s]+))\s*\)\]""")


def parse(path: str) -> list[tuple[str, Any]] | None:
    """Steps of a JSONPath (`{...}` braces optional); None when outside the subset."""
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1].strip()
    if p.startswith("$"):
        p = p[1:]
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(p):
        m = _TOKEN.match(p, pos)
        if m is None:
            return None
        if m.group(1) is not None:
            steps.append(("key", m.group(1)))
        elif m.group(2) is not None or m.group(3) is not None:
            steps.append(("key", m.group(2) if m.group(2) is not None else m.group(3)))
        elif m.group(4) is not None:
            steps.append(("index", int(m.group(4))))
        elif m.group(5) is not None:
            lit: Any
            if m.group(7) is not None or m.group(8) is not None:
                lit = m.group(7) if m.group(7) is not None else m.group(8)
            else:
                try:
                    lit = json.loads(m.group(9))
                except ValueError:
                    lit = m.group(9)
            steps.append(("filter", (m.group(5)[1:].split("."), m.group(6), lit)))
        else:
            steps.append(("all", None))
        pos = m.end()
    return steps


def find(obj: Any, steps: list[tuple[str, Any]]) -> list[Any]:
    cur = [obj]
    for kind, arg in steps:
        nxt: list[Any] = []
        for x in cur:
            if kind == "key" and isinstance(x, dict) and arg in x:
                nxt.append(x[arg])
            elif kind == "index" and isinstance(x, list) and -len(x) <= arg < len(x):
                nxt.append(x[arg])
            elif kind == "all":
                nxt.extend(x if isinstance(x, list) else x.values() if isinstance(x, dict) else [])
            elif kind == "filter" and isinstance(x, list):
                fields, op, lit = arg
                for item in x:
                    val: Any = item
                    for f in fields:
                        val = val.get(f) if isinstance(val, dict) else None
                    if (val == lit) == (op == "=="):
                        nxt.append(item)
        cur = nxt
    return cur


def _cell(typ: str, steps: list[tuple[str, Any]] | None, obj: dict[str, Any]) -> Any:
    if steps is None:
        return None
    found = find(obj, steps)
    if not found:
        return None
    value = found[0]
    if typ == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return None
        return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)
    if typ == "integer":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value)
    if typ == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if typ == "boolean":
        return value if isinstance(value, bool) else None
    if typ == "date":
        if not isinstance(value, str):
            return None
        try:
            return meta.human_duration((meta.utcnow() - meta.parse_rfc3339(value)).total_seconds())
        except ValueError:
            return None
    return None


def table_columns(definitions: list[Any]) -> tuple[Column, ...]:
    """NAME, then the version's printer columns (or kube's default Age column)."""
    cols = [c for c in definitions if isinstance(c, dict)] or [DEFAULT_AGE]
    out = [NAME_COLUMN]
    for c in cols:
        jp = str(c.get("jsonPath") or "")
        steps = parse(jp)
        typ = str(c.get("type") or "string")

        def value(obj: dict[str, Any], typ: str = typ, steps: Any = steps) -> Any:
            return _cell(typ, steps, obj)

        desc = c.get("description") or f"Custom resource definition column (in JSONPath format): {jp}"
        out.append(Column(str(c.get("name") or ""), value, type=typ, priority=int(c.get("priority") or 0),
                          format=str(c.get("format") or ""), description=str(desc)))
    return tuple(out)
