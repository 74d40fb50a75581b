"""kfleet: the kubectl-like command line for Fleet (also mounted as `fleet ctl`).

A thin synchronous shell over the async `fleet.client`: each command parses
its arguments with cyclopts, opens one `Client` inside `trio.run`, does its
work, and returns an exit code.  Output (tables, yaml/json, describe text)
is formatted by `fleet.cli.printing`; apply logic lives in
`fleet.client.apply` so other tools can reuse it.  Messages follow kubectl's
wording (`deployment.apps/web created`, `Error from server (NotFound): ...`)
because people paste them into searches and scripts grep for them.

Global options (--kubeconfig, --context, -n/--namespace) are accepted both
before the command (`app` is the meta app that takes them) and after it (every
command takes them, flattened from `Globals`), like kubectl.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

import httpx
import trio
from cyclopts import App, CycloptsError, Parameter

import fleet
from fleet.cli import printing
from fleet.client.apply import ApplyError, ApplyFailed, apply_object
from fleet.client.discovery import APIResource, ResourceNotFound, in_category
from fleet.client.errors import explain
from fleet.client.kubeconfig import ClientConfig, KubeconfigError, load_kubeconfig
from fleet.client.manifests import ManifestError, load_manifests
from fleet.client.rest import TABLE_ACCEPT, ApiException, Client, ssl_context
from fleet.client.streams import (
    STDIN_CHUNK,
    ExecOptions,
    LogOptions,
    open_log_stream,
    parse_duration,
    run_remote_command,
)


@Parameter(name="*")
@dataclass(frozen=True)
class Globals:
    """Options every command accepts."""

    kubeconfig: Annotated[str | None, Parameter(help="Path to the kubeconfig file.")] = None
    context: Annotated[str | None, Parameter(help="The kubeconfig context to use.")] = None
    namespace: Annotated[str | None, Parameter(
        name=["--namespace", "-n"], help="Namespace (default: the context's, else 'default').",
    )] = None


HELP = "Control a Fleet cluster (a kubectl-compatible CLI)."

# `commands` holds the subcommands; `app` (defined at the end of the module)
# is its meta app, which also takes the global options before the command
# name.  Mount `app` (as `fleet ctl` does); add new commands to `commands`.
commands = App(name="kfleet", help=HELP, version=fleet.__version__, version_flags=[])

# Options given before the command name, set by the meta launcher for the
# duration of one invocation; per-command options win over these.
_leading = Globals()


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _out(msg: str) -> None:
    print(msg, flush=True)


def api_error_text(exc: ApiException) -> str:
    """`Error from server (NotFound): pods "x" not found`, as kubectl prints it."""
    return f"Error from server ({exc.reason}): {exc.message}"


@dataclass(frozen=True)
class Session:
    config: ClientConfig
    namespace: str


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _run(g: Globals | None, fn: Callable[[Client, Session], Awaitable[int]]) -> int:
    """Load the kubeconfig, run `fn` under Trio with a Client, map errors to exit codes."""
    g = g or Globals()
    merged = replace(_leading, **{k: v for k, v in vars(g).items() if v is not None})
    try:
        config = load_kubeconfig(merged.kubeconfig, merged.context)
    except KubeconfigError as exc:
        _err(f"error: {exc}")
        return 1
    session = Session(config, merged.namespace or config.namespace)

    async def main() -> int:
        async with Client(config) as client:
            return await fn(client, session)

    try:
        return trio.run(main)
    except KeyboardInterrupt:
        return 130
    except (Exception, BaseExceptionGroup) as raised:
        exc = _unwrap(raised)  # a nursery wraps errors in groups; report the one inside
        if isinstance(exc, ApiException):
            _err(api_error_text(exc))
        elif isinstance(exc, ResourceNotFound | ManifestError | ApplyError):
            _err(f"error: {exc}")
        elif isinstance(exc, httpx.TransportError):
            _err(f"Unable to connect to the server at {config.server}: {explain(exc)}")
        elif isinstance(exc, KeyboardInterrupt):
            return 130
        else:
            raise
        return 1


# -- argument helpers ---------------------------------------------------------


def _split_type_args(args: list[str]) -> tuple[list[tuple[str, list[str]]], str | None]:
    """[(typed resource, [names])] from `TYPE[,TYPE] NAME...` or `TYPE/NAME ...`."""
    if not args:
        return [], "you must specify the type of resource to get"
    if "/" in args[0]:
        out: list[tuple[str, list[str]]] = []
        for a in args:
            typ, sep, name = a.partition("/")
            if not sep or not typ or not name:
                return [], f"there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (got {a!r})"
            for entry in out:
                if entry[0] == typ:
                    entry[1].append(name)
                    break
            else:
                out.append((typ, [name]))
        return out, None
    types = [t for t in args[0].split(",") if t]
    return [(t, list(args[1:])) for t in types], None


async def _expand_types(client: Client, pairs: list[tuple[str, list[str]]]
                        ) -> list[tuple[APIResource, list[str]]]:
    out: list[tuple[APIResource, list[str]]] = []
    for typed, names in pairs:
        if typed.lower() == "all" and not names:
            for res in in_category(await client.discover(), "all"):
                out.append((res, []))
            continue
        out.append((await client.resolve(typed), names))
    return out


def _ns_for(res: APIResource, namespace: str | None) -> str | None:
    return namespace if res.namespaced else None


def _no_resources(session: Session, all_namespaces: bool, any_namespaced: bool) -> str:
    if all_namespaces or not any_namespaced:
        return "No resources found"
    return f"No resources found in {session.namespace} namespace."


def _fallback_table(res: APIResource, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A NAME/AGE table built client-side, for servers that ignore the Table Accept."""
    from fleet.api import meta

    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "priority": 0},
        ],
        "rows": [{"cells": [(o.get("metadata") or {}).get("name"), meta.age(o)],
                  "object": {"kind": "PartialObjectMetadata",
                             "apiVersion": "meta.k8s.io/v1",
                             "metadata": o.get("metadata") or {}}} for o in items],
    }


def _as_table(res: APIResource, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("kind") == "Table":
        return body
    if "items" in body:
        return _fallback_table(res, body.get("items") or [])
    return _fallback_table(res, [body])


def _with_type(res: APIResource, obj: dict[str, Any]) -> dict[str, Any]:
    out = {"apiVersion": res.api_version, "kind": res.kind}
    out.update(obj)
    return out


# -- apply ----------------------------------------------------------------------


@commands.command
def apply(
    *,
    filename: Annotated[list[str], Parameter(
        name=["--filename", "-f"], allow_leading_hyphen=True, consume_multiple=False,
        help="Files, directories or - (stdin) to apply (repeatable).")],
    recursive: Annotated[bool, Parameter(name=["--recursive", "-R"], negative="",
                                         help="Recurse into directories.")] = False,
    dry_run: Annotated[Literal["none", "server"], Parameter(
        help="server: ask the server to validate without persisting.")] = "none",
    g: Globals | None = None,
) -> int:
    """Create or update objects from manifests (client-side three-way apply)."""
    try:
        manifests = load_manifests(filename, recursive=recursive)
    except ManifestError as exc:
        _err(f"error: {exc}")
        return 1
    if not manifests:
        _err("error: no objects passed to apply")
        return 1

    async def run(client: Client, session: Session) -> int:
        rc = 0
        for m in manifests:
            try:
                result = await apply_object(client, m.obj, session.namespace,
                                            dry_run=dry_run == "server")
            except ApplyFailed as exc:
                _err(f'Error from server ({exc.error.reason}): error when {exc.operation} '
                     f'"{m.source}": {exc.error.message}')
                rc = 1
                continue
            except (ApiException, ApplyError) as exc:
                _err(api_error_text(exc) if isinstance(exc, ApiException) else f"error: {exc}")
                rc = 1
                continue
            suffix = " (server dry run)" if dry_run == "server" else ""
            _out(result.describe() + suffix)
        return rc

    return _run(g, run)


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


# -- delete ---------------------------------------------------------------------

_PROPAGATION = {"background": "Background", "foreground": "Foreground", "orphan": "Orphan",
                "true": "Background", "false": "Orphan"}


@commands.command
def delete(
    *args: str,
    filename: Annotated[list[str] | None, Parameter(
        name=["--filename", "-f"], allow_leading_hyphen=True, consume_multiple=False,
        help="Files, directories or - (stdin) naming what to delete (repeatable).")] = None,
    recursive: Annotated[bool, Parameter(name=["--recursive", "-R"], negative="")] = False,
    selector: Annotated[str | None, Parameter(name=["--selector", "-l"])] = None,
    field_selector: str | None = None,
    all: Annotated[bool, Parameter(name="--all", negative="")] = False,
    wait: bool = True,
    timeout: Annotated[float, Parameter(help="Seconds to wait for deletion (with --wait).")] = 60.0,
    grace_period: int | None = None,
    now: Annotated[bool, Parameter(negative="")] = False,
    force: Annotated[bool, Parameter(negative="")] = False,
    cascade: Literal["background", "foreground", "orphan", "true", "false"] = "background",
    ignore_not_found: Annotated[bool, Parameter(negative="")] = False,
    g: Globals | None = None,
) -> int:
    """Delete objects by file, by TYPE NAME..., TYPE/NAME, label selector or --all."""
    manifests = []
    if filename:
        if args:
            _err("error: resource(s) were provided, but no name was specified")
            return 1
        try:
            manifests = load_manifests(filename, recursive=recursive)
        except ManifestError as exc:
            _err(f"error: {exc}")
            return 1
        pairs: list[tuple[str, list[str]]] = []
    else:
        pairs, problem = _split_type_args(list(args))
        if problem:
            _err(f"error: {problem}")
            return 1
        if not any(names for _, names in pairs) and not (selector or field_selector or all):
            _err("error: resource(s) were provided, but no name was specified")
            return 1
    body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                            "propagationPolicy": _PROPAGATION[cascade]}
    if force:
        body["gracePeriodSeconds"] = 0
    elif now:
        body["gracePeriodSeconds"] = 1
    elif grace_period is not None and grace_period >= 0:
        body["gracePeriodSeconds"] = grace_period

    async def run(client: Client, session: Session) -> int:
        rc = 0
        todo: list[tuple[APIResource, str, str | None]] = []
        for m in manifests:
            md = m.obj.get("metadata") or {}
            res = await client.resource_for_kind(m.obj["apiVersion"], m.obj["kind"])
            todo.append((res, md.get("name", ""),
                         (md.get("namespace") or session.namespace) if res.namespaced else None))
        for res, names in await _expand_types(client, pairs):
            ns = _ns_for(res, session.namespace)
            if names:
                todo.extend((res, n, ns) for n in names)
            else:
                listed = await client.list_all(res.api_version, res.name, ns,
                                               label_selector=selector,
                                               field_selector=field_selector)
                todo.extend((res, (o.get("metadata") or {}).get("name", ""), ns)
                            for o in listed.get("items") or [])
        if not todo:
            _err("No resources found")
            return 0
        deleted: list[tuple[APIResource, str, str | None, str | None]] = []
        for res, name, ns in todo:
            try:
                result = await client.delete(res.api_version, res.name, name, ns, body=body)
            except ApiException as exc:
                if exc.code == 404 and ignore_not_found:
                    continue
                _err(api_error_text(exc))
                rc = 1
                continue
            _out(f'{res.kind_prefix} "{name}" deleted')
            uid = (result.get("metadata") or {}).get("uid") if result.get("kind") != "Status" \
                else (result.get("details") or {}).get("uid")
            deleted.append((res, name, ns, uid))
        if wait and deleted:
            rc = max(rc, await _wait_deleted(client, deleted, timeout))
        return rc

    return _run(g, run)


async def _wait_deleted(client: Client, deleted: list[tuple[APIResource, str, str | None, str | None]],
                        timeout: float) -> int:
    """Poll until each object is gone (404, or replaced by one with another uid)."""
    pending = list(deleted)
    with trio.move_on_after(timeout):
        while pending:
            still = []
            for res, name, ns, uid in pending:
                try:
                    live = await client.get_object(res.api_version, res.name, name, ns)
                except ApiException as exc:
                    if exc.code == 404:
                        continue
                    raise
                if uid and (live.get("metadata") or {}).get("uid") not in (None, uid):
                    continue
                still.append((res, name, ns, uid))
            pending = still
            if pending:
                await trio.sleep(0.25)
    for res, name, _ns, _uid in pending:
        _err(f"error: timed out waiting for the condition on {res.group_resource}/{name}")
    return 1 if pending else 0


# -- logs, exec ---------------------------------------------------------------------


def _pod_name(arg: str) -> str | None:
    """`p`, `pod/p` or `pods/p` → `p` (None for another type)."""
    typ, sep, name = arg.partition("/")
    if not sep:
        return arg
    return name if typ in ("pod", "pods", "po") and name else None


async def _default_container(client: Client, namespace: str, pod: str) -> str | None:
    """kubectl's choice when -c is not given: the default-container annotation, else the first.

    Reading the pod first also turns a missing pod into the plain NotFound error.
    """
    obj = await client.get_object("v1", "pods", pod, namespace)
    names = [c.get("name") for c in (obj.get("spec") or {}).get("containers") or []]
    if len(names) <= 1:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    chosen = annotations.get("kubectl.kubernetes.io/default-container")
    if chosen not in names:
        chosen = names[0]
        _err(f'Defaulted container "{chosen}" out of: {", ".join(str(n) for n in names)}')
    return chosen


@commands.command
def logs(
    pod: str,
    *,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    follow: Annotated[bool, Parameter(name=["--follow", "-f"], negative="")] = False,
    tail: Annotated[int, Parameter(help="Lines of recent log to show; -1 for all.")] = -1,
    since: Annotated[str | None, Parameter(help="Only logs newer than a duration, e.g. 10s, 5m.")] = None,
    since_time: Annotated[str | None, Parameter(help="Only logs after an RFC3339 time.")] = None,
    timestamps: Annotated[bool, Parameter(negative="")] = False,
    previous: Annotated[bool, Parameter(name=["--previous", "-p"], negative="")] = False,
    limit_bytes: int | None = None,
    g: Globals | None = None,
) -> int:
    """Print the logs of a container in a pod (-f to follow)."""
    name = _pod_name(pod)
    if name is None:
        _err(f"error: logs are only served for pods (got {pod!r})")
        return 1
    since_seconds = None
    if since is not None:
        if since_time:
            _err("error: at most one of `sinceTime` or `sinceSeconds` may be specified")
            return 1
        try:
            # The API takes whole seconds; round up so nothing asked for is cut off.
            since_seconds = max(1, math.ceil(parse_duration(since)))
        except ValueError as exc:
            _err(f"error: {exc}")
            return 1

    async def run(client: Client, session: Session) -> int:
        chosen = container or await _default_container(client, session.namespace, name)
        opts = LogOptions(container=chosen, follow=follow, tail_lines=tail if tail >= 0 else None,
                          since_seconds=since_seconds, since_time=since_time,
                          timestamps=timestamps, previous=previous, limit_bytes=limit_bytes)
        out = sys.stdout.buffer
        async with open_log_stream(session.config, session.namespace, name, opts) as chunks:
            async for chunk in chunks:
                out.write(chunk)
                out.flush()
        return 0

    return _run(g, run)


async def _read_stdin() -> bytes:
    # A worker thread: putting fd 0 in non-blocking mode for Trio would also
    # change the terminal's stdout, which shares the open file description.
    return await trio.to_thread.run_sync(os.read, sys.stdin.fileno(), STDIN_CHUNK,
                                         abandon_on_cancel=True)


def _terminal_size() -> tuple[int, int] | None:
    """(columns, rows) of the terminal on stdout, else on stdin; None without one."""
    for stream in (sys.stdout, sys.stdin):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError):
            continue
        if size.columns > 0 and size.lines > 0:
            return size.columns, size.lines
    return None


async def _terminal_sizes() -> AsyncIterator[tuple[int, int]]:
    """The terminal size now, then again after every SIGWINCH."""
    with trio.open_signal_receiver(signal.SIGWINCH) as winch:
        size = _terminal_size()
        if size:
            yield size
        async for _ in winch:
            new = _terminal_size()
            if new and new != size:
                size = new
                yield size


@contextlib.contextmanager
def _raw_terminal(enabled: bool) -> Iterator[None]:
    """The local terminal in raw mode (keys go to the remote tty as typed), restored after."""
    if not enabled:
        yield
        return
    import termios
    import tty as ttymod

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        ttymod.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _write(stream: Any) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def _remote_command(subresource: str, pod: str, command: tuple[str, ...], container: str | None,
                    stdin: bool, tty: bool, g: Globals | None) -> int:
    name = _pod_name(pod)
    if name is None:
        _err(f"error: {subresource} works on pods only (got {pod!r})")
        return 1
    if subresource == "exec" and not command:
        _err("error: you must specify at least one command for the container")
        return 1
    # As kubectl: a tty only makes sense for a terminal on stdin, which then
    # goes raw; -t alone (no -i) is ignored.
    raw = tty and stdin and sys.stdin.isatty()
    if tty and stdin and not raw:
        _err("Unable to use a TTY - input is not a terminal or the right kind of file")

    async def run(client: Client, session: Session) -> int:
        chosen = container or await _default_container(client, session.namespace, name)
        opts = ExecOptions(command=command, container=chosen, stdin=stdin, tty=raw)
        with _raw_terminal(raw):
            result = await run_remote_command(
                session.config, session.namespace, name, subresource, opts,
                read_stdin=_read_stdin if stdin else None,
                write_stdout=_write(sys.stdout.buffer), write_stderr=_write(sys.stderr.buffer),
                sizes=_terminal_sizes() if opts.tty else None)
        if result.exit_code != 0 and result.message:
            _err(result.message)
        return result.exit_code

    return _run(g, run)


@commands.command(name="exec")
def exec_(
    pod: str,
    *command: str,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    stdin: Annotated[bool, Parameter(name=["--stdin", "-i"], negative="")] = False,
    tty: Annotated[bool, Parameter(name=["--tty", "-t"], negative="")] = False,
    g: Globals | None = None,
) -> int:
    """Run a command in a container: kfleet exec POD [-c C] [-i] [-t] -- CMD [ARG...]."""
    return _remote_command("exec", pod, command, container, stdin, tty, g)


@commands.command
def attach(
    pod: str,
    *,
    container: Annotated[str | None, Parameter(name=["--container", "-c"])] = None,
    stdin: Annotated[bool, Parameter(name=["--stdin", "-i"], negative="")] = False,
    tty: Annotated[bool, Parameter(name=["--tty", "-t"], negative="")] = False,
    g: Globals | None = None,
) -> int:
    """Attach to the main process of a running container."""
    return _remote_command("attach", pod, (), container, stdin, tty, g)

# -- image import / list ----------------------------------------------------------------

image = App(name="image", help="Manage images on a node (through the API server's node proxy).")
commands.command(image)

UPLOAD_CHUNK = 1 << 20


async def _pick_node(client: Client, node: str | None) -> str | None:
    """The node to act on: the given one, else the cluster's only node.  None (after a
    kubectl-style error listing the candidates) when that is ambiguous."""
    if node:
        return node
    names = sorted(n["metadata"]["name"] for n in (await client.get("/api/v1/nodes")).get("items", []))
    if len(names) == 1:
        return names[0]
    if not names:
        _err("error: the cluster has no nodes")
    else:
        _err(f"error: a node must be specified with --node, choose one of: [{' '.join(names)}]")
    return None


def _node_proxy_path(node: str, path: str) -> str:
    return f"/api/v1/nodes/{quote(node, safe='')}/proxy/{path}"


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    async with await trio.open_file(path, "rb") as f:
        while chunk := await f.read(UPLOAD_CHUNK):
            yield chunk


async def upload_archive(config: ClientConfig, node: str, path: Path,
                         name: str | None = None) -> list[str]:
    """POST one archive to the node's agent (nodes/{node}/proxy/images/import), streamed
    from disk with its length declared, so the agent can refuse an oversized one at once
    and tell a cut-off upload from a complete one.  Returns the refs imported."""
    headers = {"User-Agent": f"kfleet/{fleet.__version__}", "Accept": "application/json",
               "Content-Type": "application/x-tar",
               "Content-Length": str(path.stat().st_size)}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    # No read timeout: the agent answers only once the whole image is unpacked.
    timeout = httpx.Timeout(30.0, read=None, write=None)
    async with httpx.AsyncClient(base_url=config.server, verify=ssl_context(config),
                                 timeout=timeout) as http:
        resp = await http.post(_node_proxy_path(node, "images/import"),
                               params={"name": name} if name else None,
                               content=_file_chunks(path), headers=headers)
        if resp.status_code >= 400:
            raise ApiException.from_response(resp)
        return list(resp.json().get("images") or [])


@image.command(name="import")
def image_import(
    files: Annotated[list[Path], Parameter(negative="", help="Archive files (.tar, .tar.gz).")],
    *,
    node: Annotated[str | None, Parameter(help="The node to import into (default: the only node).")] = None,
    name: Annotated[str | None, Parameter(
        help="Name for images the archive leaves unnamed (or only tags).")] = None,
    g: Globals | None = None,
) -> int:
    """Import OCI-layout or `docker save` archives into a node's image store."""
    for f in files:
        if not f.is_file():
            _err(f"error: {f}: no such file")
            return 1

    async def run(client: Client, session: Session) -> int:
        target = await _pick_node(client, node)
        if target is None:
            return 1
        for f in files:
            for ref in await upload_archive(session.config, target, f, name):
                _out(f"imported {ref}")
        return 0

    return _run(g, run)


@image.command(name="list")
def image_list(
    *,
    node: Annotated[str | None, Parameter(help="The node to list (default: the only node).")] = None,
    g: Globals | None = None,
) -> int:
    """List the images in a node's image store."""

    async def run(client: Client, session: Session) -> int:
        target = await _pick_node(client, node)
        if target is None:
            return 1
        doc = await client.get(_node_proxy_path(target, "images"))
        rows = [[i.get("ref", ""), str(i.get("id", "")).removeprefix("sha256:")[:12],
                 _human_size(int(i.get("size") or 0))] for i in doc.get("images") or []]
        _out(printing.format_simple_table(["IMAGE", "ID", "SIZE"], rows))
        return 0

    return _run(g, run)


def _human_size(n: int) -> str:
    """Docker-style sizes (decimal units): 1.2MB."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.3g}{unit}" if unit != "B" else f"{n}B"
        size /= 1000
    return f"{n}B"


# -- node maintenance -------------------------------------------------------------------
# cordon/uncordon/schedulable use Fleet's nodes/{name}/schedulable subresource; drain and
# drain-status its nodes/{name}/drain, which drains in the server (fleet/server/drain.py):
# the drain goes on if kfleet exits, and `drain-status` (or --wait) follows it.

DRAIN_POLL = 1.0


def _node_path(node: str, sub: str) -> str:
    return f"/api/v1/nodes/{quote(node, safe='')}/{sub}"


async def _set_schedulable(client: Client, node: str, schedulable: bool) -> None:
    """Print kubectl's `node/x cordoned` / `already cordoned` / `uncordoned` lines."""
    before = await client.get_object("v1", "nodes", node)
    was = (before.get("spec") or {}).get("unschedulable") is True
    await client.request("POST", _node_path(node, "schedulable"), json={"schedulable": schedulable})
    if schedulable:
        _out(f"node/{node} uncordoned" if was else f"node/{node} already uncordoned")
    else:
        _out(f"node/{node} already cordoned" if was else f"node/{node} cordoned")


@commands.command
def cordon(node: str, *, g: Globals | None = None) -> int:
    """Mark a node unschedulable (new pods are not placed on it)."""

    async def run(client: Client, session: Session) -> int:
        await _set_schedulable(client, node, False)
        return 0

    return _run(g, run)


@commands.command
def uncordon(node: str, *, g: Globals | None = None) -> int:
    """Mark a node schedulable again (also cancels a drain of it that is still running)."""

    async def run(client: Client, session: Session) -> int:
        await _set_schedulable(client, node, True)
        return 0

    return _run(g, run)


@commands.command
def schedulable(node: str, value: Literal["true", "false"], *, g: Globals | None = None) -> int:
    """Set whether new pods may be scheduled on a node: kfleet schedulable NODE true|false."""

    async def run(client: Client, session: Session) -> int:
        await _set_schedulable(client, node, value == "true")
        return 0

    return _run(g, run)


def _drain_lines(doc: dict[str, Any]) -> list[str]:
    """A drain's progress as `Key: value` lines (what drain-status prints)."""
    def joined(key: str) -> str:
        return ", ".join(doc.get(key) or []) or "<none>"

    opts = doc.get("options") or {}
    flags = [f for f, on in (("ignoreDaemonSets", opts.get("ignoreDaemonSets")),
                             ("deleteEmptyDirData", opts.get("deleteEmptyDirData")),
                             ("force", opts.get("force"))) if on]
    grace = opts.get("gracePeriodSeconds")
    if isinstance(grace, int) and grace >= 0:
        flags.append(f"gracePeriodSeconds={grace}")
    if opts.get("timeoutSeconds"):
        flags.append(f"timeoutSeconds={opts['timeoutSeconds']}")
    rows = [("Node", (doc.get("metadata") or {}).get("name", "")), ("Phase", doc.get("phase", "")),
            ("Options", ", ".join(flags) or "<none>"), ("Started", doc.get("startTime") or "<none>"),
            ("Completed", doc.get("completionTime") or "<none>"), ("Evicted", joined("evicted")),
            ("Remaining", joined("remaining")), ("Blocked by budget", joined("blockedByBudget")),
            ("Skipped", joined("skipped"))]
    width = max(len(k) for k, _ in rows) + 2
    out = [f"{k + ':':<{width}}{v}" for k, v in rows]
    for key, title in (("warnings", "Warnings"), ("errors", "Errors")):
        items = doc.get(key) or []
        if items:
            out.append(f"{title}:")
            out.extend(f"  {x}" for x in items)
    return out


async def _follow_drain(client: Client, node: str, timeout: float | None) -> int:
    """Print evictions as they happen (kubectl's `evicting pod ns/p`, `pod/p evicted`)
    until the drain ends; 0 only when it is Complete."""
    shown: set[str] = set()
    done: set[str] = set()
    blocked_seen: set[str] = set()
    with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
        while True:
            doc = await client.get(_node_path(node, "drain"))
            for key in doc.get("evicted") or []:
                if key not in shown:
                    shown.add(key)
                    _out(f"evicting pod {key}")
            for key in doc.get("blockedByBudget") or []:
                if key not in blocked_seen:
                    blocked_seen.add(key)
                    _err(f'error when evicting pods/"{key.partition("/")[2]}" -n "{key.partition("/")[0]}" '
                         "(will retry after 5s): Cannot evict pod as it would violate the pod's "
                         "disruption budget.")
            remaining = set(doc.get("remaining") or [])
            for key in sorted(shown - remaining - done):
                done.add(key)
                _out(f"pod/{key.partition('/')[2]} evicted")
            phase = doc.get("phase")
            if phase != "Running":
                break
            await trio.sleep(DRAIN_POLL)
    if scope.cancelled_caught:
        _err(f"error: timed out waiting for the drain of node/{node}; it goes on in the server "
             f"(kfleet drain-status {node})")
        return 1
    if phase == "Complete":
        _out(f"node/{node} drained")
        return 0
    for problem in doc.get("errors") or []:
        _err(f"error: {problem}")
    _err(f'error: unable to drain node "{node}": drain {phase}')
    return 1


@commands.command
def drain(
    node: str,
    *,
    ignore_daemonsets: Annotated[bool, Parameter(negative="", help="Leave DaemonSet-managed pods.")] = False,
    delete_emptydir_data: Annotated[bool, Parameter(
        negative="", help="Evict pods with emptyDir volumes (their data is lost).")] = False,
    force: Annotated[bool, Parameter(negative="", help="Also evict pods no controller manages.")] = False,
    grace_period: Annotated[int, Parameter(
        help="Seconds each pod gets to stop; negative: the pod's own terminationGracePeriodSeconds.")] = -1,
    timeout: Annotated[str, Parameter(help="Give up after this long (e.g. 5m); 0: never.")] = "0s",
    wait: Annotated[bool, Parameter(negative="", help="Follow the drain until it ends.")] = False,
    g: Globals | None = None,
) -> int:
    """Drain a node in the server: cordon it, then evict its pods (as kubectl drain does).

    Without --wait, kfleet returns once the server has started the drain; follow it
    with `kfleet drain-status NODE`.
    """
    try:
        # A bare number is seconds; otherwise a Go duration, as kubectl's --timeout takes.
        timeout_s = float(timeout) if timeout.replace(".", "", 1).isdigit() else parse_duration(timeout)
    except ValueError as exc:
        _err(f"error: {exc}")
        return 1
    body: dict[str, Any] = {"ignoreDaemonSets": ignore_daemonsets, "deleteEmptyDirData": delete_emptydir_data,
                            "force": force, "gracePeriodSeconds": grace_period,
                            "timeoutSeconds": math.ceil(timeout_s)}

    async def run(client: Client, session: Session) -> int:
        before = await client.get_object("v1", "nodes", node)
        await client.request("POST", _node_path(node, "drain"), json=body)
        was = (before.get("spec") or {}).get("unschedulable") is True
        _out(f"node/{node} already cordoned" if was else f"node/{node} cordoned")
        if not wait:
            _out(f"node/{node} drain started (kfleet drain-status {node})")
            return 0
        # The server enforces timeoutSeconds; the client waits a little longer to see the end.
        return await _follow_drain(client, node, timeout_s + 10 if timeout_s > 0 else None)

    return _run(g, run)


@commands.command(name="drain-status")
def drain_status(
    node: str,
    *,
    output: Annotated[Literal["yaml", "json"] | None, Parameter(name=["--output", "-o"])] = None,
    g: Globals | None = None,
) -> int:
    """Show the progress of a node's drain (phase, evicted, remaining, blocked by budget)."""

    async def run(client: Client, session: Session) -> int:
        doc = await client.get(_node_path(node, "drain"))
        if output == "json":
            _out(printing.to_json(doc))
        elif output == "yaml":
            _out(printing.to_yaml(doc).rstrip())
        else:
            _out("\n".join(_drain_lines(doc)))
        return 0

    return _run(g, run)


# -- api-resources, version -----------------------------------------------------------


@commands.command(name="api-resources")
def api_resources(
    *,
    output: Annotated[Literal["wide", "name"] | None, Parameter(name=["--output", "-o"])] = None,
    namespaced: bool | None = None,
    api_group: str | None = None,
    verbs: Annotated[list[str] | None, Parameter(name="--verbs")] = None,
    g: Globals | None = None,
) -> int:
    """List the resource types the server serves."""

    async def run(client: Client, session: Session) -> int:
        resources = [r for r in await client.discover() if r.preferred]
        if namespaced is not None:
            resources = [r for r in resources if r.namespaced == namespaced]
        if api_group is not None:
            resources = [r for r in resources if r.group == api_group]
        if verbs:
            resources = [r for r in resources if all(v in r.verbs for v in verbs)]
        group_order: dict[str, int] = {}
        for r in resources:
            group_order.setdefault(r.group, len(group_order))
        resources.sort(key=lambda r: (group_order[r.group], r.name))
        if output == "name":
            for r in resources:
                _out(r.group_resource)
        else:
            _out(printing.api_resources_table(resources, wide=output == "wide"))
        return 0

    return _run(g, run)


@commands.command
def version(
    *,
    client_only: Annotated[bool, Parameter(name="--client", negative="")] = False,
    output: Annotated[Literal["yaml", "json"] | None, Parameter(name=["--output", "-o"])] = None,
    g: Globals | None = None,
) -> int:
    """Print the client and server versions."""
    client_version = {"gitVersion": f"v{fleet.__version__}", "major": "", "minor": ""}
    major, _, rest = fleet.__version__.partition(".")
    client_version.update(major=major, minor=rest.partition(".")[0])

    def show(server: dict[str, Any] | None) -> None:
        if output:
            doc: dict[str, Any] = {"clientVersion": client_version}
            if server is not None:
                doc["serverVersion"] = server
            _out(printing.to_json(doc) if output == "json" else printing.to_yaml(doc).rstrip())
            return
        _out(f"Client Version: {client_version['gitVersion']}")
        if server is not None:
            _out(f"Server Version: {server.get('gitVersion', '<unknown>')}")

    if client_only:
        show(None)
        return 0

    async def run(client: Client, session: Session) -> int:
        try:
            server = await client.version()
        except (ApiException, httpx.TransportError):
            show(None)
            raise
        show(server)
        return 0

    return _run(g, run)


# -- entry points -----------------------------------------------------------------------


@commands.meta.default
def _launcher(
    *tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)],
    g: Globals | None = None,
) -> Any:
    """Accept the global options before the command name, then run the command."""
    global _leading
    previous = _leading
    _leading = g or Globals()
    try:
        return commands(tokens)
    finally:
        _leading = previous


app = commands.meta
app.help = HELP


def run(argv: list[str]) -> int:
    """Run kfleet in-process with `argv` (no program name); return the exit code."""
    try:
        result = app(argv, result_action="return_value", exit_on_error=False)
    except CycloptsError:
        return 2  # a usage error; cyclopts has printed it
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(result or 0)


def main() -> None:
    """The `kfleet` console script."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        # `kfleet get ... | head`: the reader left; exit quietly like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)


if __name__ == "__main__":
    main()
