"""How kfleet shows objects: kubectl-style tables, -o name/yaml/json, describe text.

The server decides *what* the columns are (it answers `get` with a
`meta.k8s.io/v1 Table`); this module decides *how* they look, matching kubectl
closely enough that people (and scripts that grep kubectl output) feel at
home: upper-case headers, columns padded to the widest cell plus three
spaces, `priority > 0` columns only with `-o wide`, NAMESPACE first for
`-A`, LABELS last for `--show-labels`, and `kind.group/name` names when one
command prints several types.  All functions are pure (strings in, strings
out) so they are unit-tested without a server.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleet.api import meta

NONE = "<none>"
# kubectl's tabwriter settings: minimum cell width 6, padding 3.
MIN_WIDTH = 6
PADDING = 3


def format_cell(value: Any) -> str:
    """One table cell as kubectl prints it."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return ",".join(format_cell(v) for v in value) if value else NONE
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def format_labels(labels: dict[str, str] | None) -> str:
    if not labels:
        return NONE
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass
class TableOptions:
    wide: bool = False
    all_namespaces: bool = False
    show_labels: bool = False
    no_headers: bool = False
    # `deployment.apps` when several types are printed: names become `deployment.apps/web`.
    name_prefix: str | None = None


@dataclass
class Rendered:
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


def _row_meta(row: dict[str, Any]) -> dict[str, Any]:
    obj = row.get("object") or {}
    return obj.get("metadata") or {}


def _name_index(defs: Sequence[dict[str, Any]]) -> int | None:
    for i, d in enumerate(defs):
        if d.get("format") == "name":
            return i
    for i, d in enumerate(defs):
        if str(d.get("name", "")).lower() == "name":
            return i
    return None


def table_rows(table: dict[str, Any], opts: TableOptions) -> Rendered:
    """Select and format a Table's columns and rows (no padding yet)."""
    defs = table.get("columnDefinitions") or []
    keep = [i for i, d in enumerate(defs) if opts.wide or int(d.get("priority") or 0) == 0]
    name_idx = _name_index(defs)
    header = [str(defs[i].get("name", "")).upper() for i in keep]
    if opts.all_namespaces:
        header.insert(0, "NAMESPACE")
    if opts.show_labels:
        header.append("LABELS")
    out = Rendered(header)
    for row in table.get("rows") or []:
        cells = row.get("cells") or []
        md = _row_meta(row)
        line = []
        for i in keep:
            text = format_cell(cells[i] if i < len(cells) else None)
            if i == name_idx and opts.name_prefix:
                text = f"{opts.name_prefix}/{text}"
            line.append(text)
        if opts.all_namespaces:
            line.insert(0, md.get("namespace") or "")
        if opts.show_labels:
            line.append(format_labels(md.get("labels")))
        out.rows.append(line)
    return out


def column_widths(lines: Sequence[Sequence[str]], minimum: Sequence[int] = ()) -> list[int]:
    ncols = max((len(r) for r in lines), default=0)
    widths = [0] * ncols
    for r in lines:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c) + PADDING, MIN_WIDTH)
    for i, m in enumerate(minimum):
        if i < ncols:
            widths[i] = max(widths[i], m)
    return widths


def pad_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Cells padded to `widths`; the last cell is not padded (like tabwriter)."""
    parts = [c.ljust(widths[i]) if i < len(cells) - 1 else c for i, c in enumerate(cells)]
    return "".join(parts)


def render_table(rendered: Rendered, opts: TableOptions | None = None,
                 widths: Sequence[int] = ()) -> tuple[list[str], list[int]]:
    """Lines of a padded table and the column widths used (for watch rows later)."""
    opts = opts or TableOptions()
    lines_in = ([] if opts.no_headers else [rendered.header]) + rendered.rows
    w = column_widths(lines_in, widths)
    return [pad_row(r, w) for r in lines_in], w


def format_table(table: dict[str, Any], opts: TableOptions | None = None) -> str:
    """A whole Table as kubectl prints it (without trailing newline)."""
    opts = opts or TableOptions()
    lines, _ = render_table(table_rows(table, opts), opts)
    return "\n".join(lines)


def format_simple_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines, _ = render_table(Rendered(list(header), [list(r) for r in rows]))
    return "\n".join(lines)


def object_name(obj: dict[str, Any], kind_prefix: str) -> str:
    """`-o name` form: `deployment.apps/web`."""
    return f"{kind_prefix}/{(obj.get('metadata') or {}).get('name', '')}"


def to_yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, default_flow_style=False, sort_keys=True, allow_unicode=True)


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=4, sort_keys=False)


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The `kind: List` wrapper kubectl prints for several objects with -o yaml/json."""
    return {"apiVersion": "v1", "items": items, "kind": "List",
            "metadata": {"resourceVersion": ""}}


# -- describe -----------------------------------------------------------------

_CAMEL = re.compile(r"^[a-z][A-Za-z0-9]*$")
# Maps whose keys are user data (label keys, resource names), printed verbatim.
_VERBATIM_MAPS = {"labels", "annotations", "matchLabels", "selector", "nodeSelector", "data",
                  "stringData", "binaryData", "capacity", "allocatable", "limits", "requests",
                  "hard", "used"}
_SKIP_ANNOTATIONS = {"kubectl.kubernetes.io/last-applied-configuration"}


def humanize_key(key: str) -> str:
    """`matchLabels` -> `Match Labels` (kubectl's generic describer does this)."""
    if not _CAMEL.match(key):
        return key
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", words)
    return words[:1].upper() + words[1:]


def _scalar(v: Any) -> str:
    if v is None:
        return NONE
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _inline(v: Any) -> bool:
    """Printed on the key's own line (scalars, empty maps and lists)."""
    return not isinstance(v, dict | list) or not v


def _describe_value(key: str, value: Any, indent: int, out: list[str],
                    verbatim: bool = False) -> None:
    pad = "  " * indent
    label = key if verbatim else humanize_key(key)
    if isinstance(value, dict):
        if not value:
            out.append(f"{pad}{label}:  {NONE}")
            return
        out.append(f"{pad}{label}:")
        flat = all(not isinstance(v, dict | list) for v in value.values())
        _describe_map(value, indent + 1, out, verbatim=flat and key in _VERBATIM_MAPS)
    elif isinstance(value, list):
        if not value:
            out.append(f"{pad}{label}:  {NONE}")
        elif all(not isinstance(v, dict | list) for v in value):
            out.append(f"{pad}{label}:  {', '.join(_scalar(v) for v in value)}")
        else:
            out.append(f"{pad}{label}:")
            for item in value:
                if isinstance(item, dict) and item:
                    sub: list[str] = []
                    _describe_map(item, indent + 2, sub)
                    first = sub[0]
                    # Mark where each list item starts: "  - Name:  web".
                    sub[0] = "  " * (indent + 1) + "- " + first[len("  " * (indent + 2)):]
                    out.extend(sub)
                else:
                    out.append(f"{'  ' * (indent + 1)}- {_scalar(item)}")
    else:
        out.append(f"{pad}{label}:  {_scalar(value)}")


def _describe_map(value: dict[str, Any], indent: int, out: list[str],
                  verbatim: bool = False) -> None:
    def label_of(k: str) -> str:
        return k if verbatim else humanize_key(k)

    width = max((len(label_of(k)) for k, v in value.items() if _inline(v)), default=0)
    pad = "  " * indent
    for k, v in value.items():
        if not _inline(v):
            _describe_value(k, v, indent, out, verbatim=verbatim)
        else:
            if isinstance(v, dict | list):
                v = None  # empty: <none>
            out.append(f"{pad}{(label_of(k) + ':').ljust(width + 1)}  {_scalar(v)}")


def _kv_block(title: str, mapping: dict[str, str] | None, width: int) -> list[str]:
    items = sorted((mapping or {}).items())
    if not items:
        return [f"{title + ':':<{width}}{NONE}"]
    lines = []
    for i, (k, v) in enumerate(items):
        prefix = f"{title + ':':<{width}}" if i == 0 else " " * width
        lines.append(f"{prefix}{k}={v}" if title == "Labels" else f"{prefix}{k}: {v}")
    return lines


def _event_time(ev: dict[str, Any]) -> str | None:
    return (ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp")
            or (ev.get("metadata") or {}).get("creationTimestamp"))


def _event_age(ev: dict[str, Any], now: _dt.datetime | None = None) -> str:
    ts = _event_time(ev)
    if not ts:
        return "<unknown>"
    try:
        when = meta.parse_rfc3339(str(ts))
    except ValueError:
        return "<unknown>"
    now = now or _dt.datetime.now(_dt.UTC)
    return meta.human_duration((now - when).total_seconds())


def describe_events(events: list[dict[str, Any]]) -> list[str]:
    if not events:
        return ["Events:  <none>"]
    events = sorted(events, key=lambda e: str(_event_time(e) or ""))
    header = ["Type", "Reason", "Age", "From", "Message"]
    rows = []
    for ev in events:
        source = (ev.get("source") or {}).get("component") or ev.get("reportingComponent") or ""
        rows.append([ev.get("type") or "", ev.get("reason") or "", _event_age(ev), source,
                     (ev.get("message") or "").strip()])
    rules = ["-" * len(h) for h in header]
    lines, _ = render_table(Rendered(header, [rules, *rows]))
    return ["Events:"] + ["  " + ln for ln in lines]


def describe_object(obj: dict[str, Any], events: list[dict[str, Any]] | None = None) -> str:
    """A readable multi-line description of any object, like `kubectl describe`."""
    md = obj.get("metadata") or {}
    width = len("CreationTimestamp:") + 2
    lines = [f"{'Name:':<{width}}{md.get('name', '')}"]
    if md.get("namespace"):
        lines.append(f"{'Namespace:':<{width}}{md['namespace']}")
    lines += _kv_block("Labels", md.get("labels"), width)
    annotations = {k: v for k, v in (md.get("annotations") or {}).items()
                   if k not in _SKIP_ANNOTATIONS}
    lines += _kv_block("Annotations", annotations, width)
    lines.append(f"{'CreationTimestamp:':<{width}}{md.get('creationTimestamp') or NONE}")
    if md.get("deletionTimestamp"):
        lines.append(f"{'DeletionTimestamp:':<{width}}{md['deletionTimestamp']}")
    owners = md.get("ownerReferences") or []
    if owners:
        refs = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in owners)
        lines.append(f"{'Controlled By:':<{width}}{refs}")
    lines.append(f"{'API Version:':<{width}}{obj.get('apiVersion', '')}")
    lines.append(f"{'Kind:':<{width}}{obj.get('kind', '')}")
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "metadata"):
            continue
        _describe_value(key, value, 0, lines)
    if events is not None:
        lines += describe_events(events)
    return "\n".join(lines)


def api_resources_table(resources: Sequence[Any], *, wide: bool = False) -> str:
    """`kfleet api-resources`: NAME SHORTNAMES APIVERSION NAMESPACED KIND [VERBS CATEGORIES]."""
    header = ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    if wide:
        header += ["VERBS", "CATEGORIES"]
    rows = []
    for r in resources:
        row = [r.name, ",".join(r.short_names), r.api_version,
               "true" if r.namespaced else "false", r.kind]
        if wide:
            row += [",".join(r.verbs), ",".join(r.categories)]
        rows.append(row)
    return format_simple_table(header, rows)
