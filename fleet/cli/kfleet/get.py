"""kfleet get and describe: server-side tables (or yaml/json/name output) for
one or many resource types, `--watch` streams of table rows, and describe
text with the object's Events (formatting itself is `fleet.cli.printing`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated, Any, Literal

from cyclopts import Parameter

from fleet.cli import printing
from fleet.cli.kfleet.base import Globals, Session, _err, _out, _run, api_error_text, commands
from fleet.cli.kfleet.resources import (
    _as_table,
    _expand_types,
    _fallback_table,
    _no_resources,
    _ns_for,
    _split_type_args,
    _with_type,
)
from fleet.client.discovery import APIResource
from fleet.client.rest import TABLE_ACCEPT, ApiException, Client

# -- get ------------------------------------------------------------------------


OutputFormat = Literal["wide", "yaml", "json", "name"]


@commands.command
def get(
    *args: str,
    output: Annotated[OutputFormat | None, Parameter(name=["--output", "-o"])] = None,
    selector: Annotated[str | None, Parameter(name=["--selector", "-l"])] = None,
    field_selector: str | None = None,
    all_namespaces: Annotated[bool, Parameter(name=["--all-namespaces", "-A"], negative="")] = False,
    show_labels: Annotated[bool, Parameter(negative="")] = False,
    show_kind: Annotated[bool, Parameter(negative="")] = False,
    no_headers: Annotated[bool, Parameter(negative="")] = False,
    watch: Annotated[bool, Parameter(name=["--watch", "-w"], negative="")] = False,
    watch_only: Annotated[bool, Parameter(negative="")] = False,
    g: Globals | None = None,
) -> int:
    """Display one or many resources: TYPE[,TYPE...] [NAME...] or TYPE/NAME..."""
    pairs, problem = _split_type_args(list(args))
    if problem:
        _err(f"error: {problem}")
        return 1

    async def run(client: Client, session: Session) -> int:
        targets = await _expand_types(client, pairs)
        if all_namespaces and any(names for _, names in targets):
            _err("error: a resource cannot be retrieved by name across all namespaces")
            return 1
        ns = None if all_namespaces else session.namespace
        if watch or watch_only:
            if len(targets) != 1:
                _err("error: you may only specify a single resource type")
                return 1
            res, names = targets[0]
            return await _watch(client, session, res, names, ns, output, selector,
                                field_selector, all_namespaces, show_labels, no_headers,
                                watch_only)
        if output in ("yaml", "json"):
            return await _get_objects(client, targets, ns, output, selector, field_selector)
        return await _get_tables(client, session, targets, ns, output, selector,
                                 field_selector, all_namespaces, show_labels,
                                 show_kind or len(targets) > 1, no_headers)

    return _run(g, run)


async def _get_objects(client: Client, targets: list[tuple[APIResource, list[str]]],
                       ns: str | None, output: str, selector: str | None,
                       field_selector: str | None) -> int:
    items: list[dict[str, Any]] = []
    rc = 0
    single = len(targets) == 1 and len(targets[0][1]) == 1
    for res, names in targets:
        if names:
            for name in names:
                try:
                    items.append(_with_type(res, await client.get_object(
                        res.api_version, res.name, name, _ns_for(res, ns))))
                except ApiException as exc:
                    _err(api_error_text(exc))
                    rc = 1
        else:
            body = await client.list_all(res.api_version, res.name, _ns_for(res, ns),
                                         label_selector=selector, field_selector=field_selector)
            items.extend(_with_type(res, o) for o in body.get("items") or [])
    if single and items:
        doc: Any = items[0]
    elif single:
        return rc
    else:
        doc = printing.as_list(items)
    text = printing.to_yaml(doc) if output == "yaml" else printing.to_json(doc)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return rc


async def _table_for(client: Client, res: APIResource, names: list[str], ns: str | None,
                     selector: str | None, field_selector: str | None
                     ) -> tuple[dict[str, Any] | None, list[ApiException]]:
    """One Table for a type (merging per-name GETs), and the errors met on the way."""
    errors: list[ApiException] = []
    headers = {"Accept": TABLE_ACCEPT}
    rns = _ns_for(res, ns)
    if not names:
        body = await client.list(res.api_version, res.name, rns, label_selector=selector,
                                 field_selector=field_selector, headers=headers)
        return _as_table(res, body), errors
    merged: dict[str, Any] | None = None
    for name in names:
        try:
            body = await client.get_object(res.api_version, res.name, name, rns, headers=headers)
        except ApiException as exc:
            errors.append(exc)
            continue
        table = _as_table(res, body)
        if merged is None:
            merged = table
        else:
            merged["rows"] = (merged.get("rows") or []) + (table.get("rows") or [])
    return merged, errors


async def _get_tables(client: Client, session: Session,
                      targets: list[tuple[APIResource, list[str]]], ns: str | None,
                      output: str | None, selector: str | None, field_selector: str | None,
                      all_namespaces: bool, show_labels: bool, with_kind: bool,
                      no_headers: bool) -> int:
    rc = 0
    printed_any = False
    for res, names in targets:
        table, errors = await _table_for(client, res, names, ns, selector, field_selector)
        for exc in errors:
            _err(api_error_text(exc))
            rc = 1
        if table is None or not table.get("rows"):
            continue
        if output == "name":
            for row in table["rows"]:
                md = (row.get("object") or {}).get("metadata") or {}
                _out(f"{res.kind_prefix}/{md.get('name', '')}")
            printed_any = True
            continue
        opts = printing.TableOptions(
            wide=output == "wide", all_namespaces=all_namespaces and res.namespaced,
            show_labels=show_labels, no_headers=no_headers,
            name_prefix=res.kind_prefix if with_kind else None,
        )
        if printed_any and output != "name":
            _out("")
        _out(printing.format_table(table, opts))
        printed_any = True
    if not printed_any and rc == 0:
        _err(_no_resources(session, all_namespaces, any(r.namespaced for r, _ in targets)))
    return rc


async def _watch(client: Client, session: Session, res: APIResource, names: list[str],
                 ns: str | None, output: str | None, selector: str | None,
                 field_selector: str | None, all_namespaces: bool, show_labels: bool,
                 no_headers: bool, watch_only: bool) -> int:
    rns = _ns_for(res, ns)
    if names:
        if len(names) > 1:
            _err("error: watch is only supported on individual resources and resource collections")
            return 1
        name_sel = f"metadata.name={names[0]}"
        field_selector = f"{field_selector},{name_sel}" if field_selector else name_sel
    opts = printing.TableOptions(wide=output == "wide",
                                 all_namespaces=all_namespaces and res.namespaced,
                                 show_labels=show_labels, no_headers=no_headers)
    structured = output in ("yaml", "json", "name")
    headers = {} if structured else {"Accept": TABLE_ACCEPT}
    initial = await client.list(res.api_version, res.name, rns, label_selector=selector,
                                field_selector=field_selector, headers=headers)
    rv = (initial.get("metadata") or {}).get("resourceVersion")
    widths: list[int] = []
    header_printed = no_headers

    def emit_objects(objs: list[dict[str, Any]]) -> None:
        for obj in objs:
            if output == "name":
                _out(printing.object_name(obj, res.kind_prefix))
            elif output == "json":
                _out(printing.to_json(_with_type(res, obj)))
            else:
                sys.stdout.write("---\n" + printing.to_yaml(_with_type(res, obj)))
                sys.stdout.flush()

    columns: list[dict[str, Any]] = []

    def emit_table(table: dict[str, Any]) -> None:
        nonlocal widths, header_printed, columns
        # Servers send column definitions once per stream (in the list and the
        # first watch event); later events carry rows only.
        if table.get("columnDefinitions"):
            columns = table["columnDefinitions"]
        else:
            table = {**table, "columnDefinitions": columns}
        rendered = printing.table_rows(table, opts)
        lines = ([] if header_printed else [rendered.header]) + rendered.rows
        if not lines:
            return
        widths = printing.column_widths(lines, widths)
        for line in lines:
            _out(printing.pad_row(line, widths))
        header_printed = True

    if not watch_only:
        if structured:
            emit_objects(initial.get("items") or [])
        else:
            table = _as_table(res, initial)
            if table.get("rows"):
                emit_table(table)
            else:
                columns = table.get("columnDefinitions") or []
                _err(_no_resources(session, all_namespaces, res.namespaced))
    elif not structured:
        columns = _as_table(res, initial).get("columnDefinitions") or []

    events = client.watch(res.api_version, res.name, rns, resource_version=rv,
                          label_selector=selector, field_selector=field_selector,
                          headers=headers)
    async with contextlib.aclosing(events):
        async for event in events:
            obj = event.get("object") or {}
            if structured:
                emit_objects([obj])
            elif obj.get("kind") == "Table":
                emit_table(obj)
            else:
                emit_table(await _event_table(client, res, event))
    return 0


async def _event_table(client: Client, res: APIResource, event: dict[str, Any]) -> dict[str, Any]:
    """A one-row Table for a plain watch event (servers without Table watch)."""
    obj = event.get("object") or {}
    md = obj.get("metadata") or {}
    if event.get("type") != "DELETED" and md.get("name"):
        try:
            body = await client.get_object(res.api_version, res.name, md["name"],
                                           md.get("namespace"), headers={"Accept": TABLE_ACCEPT})
            if body.get("kind") == "Table":
                return body
        except ApiException:
            pass
    return _fallback_table(res, [obj])


# -- describe -------------------------------------------------------------------


async def _events_for(client: Client, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
    md = obj.get("metadata") or {}
    ns = md.get("namespace") or "default"
    sel = f"involvedObject.name={md.get('name')},involvedObject.kind={obj.get('kind')}"
    try:
        body = await client.list("v1", "events", ns, field_selector=sel)
        items = body.get("items") or []
    except ApiException as exc:
        if exc.code != 400:
            return None
        # The server does not index involvedObject: filter on our side.
        try:
            body = await client.list("v1", "events", ns)
        except ApiException:
            return None
        items = body.get("items") or []
    uid = md.get("uid")
    out = []
    for ev in items:
        inv = ev.get("involvedObject") or ev.get("regarding") or {}
        if inv.get("name") != md.get("name") or inv.get("kind") != obj.get("kind"):
            continue
        if uid and inv.get("uid") and inv["uid"] != uid:
            continue
        out.append(ev)
    return out


@commands.command
def describe(
    *args: str,
    selector: Annotated[str | None, Parameter(name=["--selector", "-l"])] = None,
    all_namespaces: Annotated[bool, Parameter(name=["--all-namespaces", "-A"], negative="")] = False,
    show_events: bool = True,
    g: Globals | None = None,
) -> int:
    """Show details of objects: TYPE [NAME...] or TYPE/NAME..."""
    pairs, problem = _split_type_args(list(args))
    if problem:
        _err(f"error: {problem}")
        return 1

    async def run(client: Client, session: Session) -> int:
        targets = await _expand_types(client, pairs)
        ns = None if all_namespaces else session.namespace
        rc = 0
        objs: list[tuple[APIResource, dict[str, Any]]] = []
        for res, names in targets:
            if names:
                for name in names:
                    try:
                        objs.append((res, await client.get_object(
                            res.api_version, res.name, name, _ns_for(res, ns))))
                    except ApiException as exc:
                        _err(api_error_text(exc))
                        rc = 1
            else:
                body = await client.list_all(res.api_version, res.name, _ns_for(res, ns),
                                             label_selector=selector)
                objs.extend((res, o) for o in body.get("items") or [])
        if not objs and rc == 0:
            _err(_no_resources(session, all_namespaces, any(r.namespaced for r, _ in targets)))
        for i, (res, obj) in enumerate(objs):
            obj = _with_type(res, obj)
            events = await _events_for(client, obj) if show_events else None
            if i:
                _out("")
                _out("")
            _out(printing.describe_object(obj, events))
        return rc

    return _run(g, run)
