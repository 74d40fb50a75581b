"""kfleet apply and delete: objects written from manifests (client-side
three-way apply, `fleet.client.apply`) and deleted by file, name, selector or
--all with kubectl's propagation flags and `--wait`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import trio
from cyclopts import Parameter

from fleet.cli.kfleet.base import Globals, Session, _err, _out, _run, api_error_text, commands
from fleet.cli.kfleet.resources import _expand_types, _ns_for, _split_type_args
from fleet.client.apply import ApplyError, ApplyFailed, apply_object
from fleet.client.discovery import APIResource
from fleet.client.manifests import ManifestError, load_manifests
from fleet.client.rest import ApiException, Client

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
