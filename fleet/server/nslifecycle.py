"""Namespace lifecycle: finalize namespaces that are being deleted.

Deleting a namespace marks it Terminating (deletionTimestamp, status.phase)
and refuses new content in it; this task then deletes every namespaced
object in it (objects with finalizers go away once their finalizers are
removed) and removes the namespace when nothing is left.  At start-up it
resumes any namespace left Terminating by a crash.
"""

from __future__ import annotations

import logging

import trio

from fleet.api import meta
from fleet.api.registry import Registry
from fleet.store import KeyNotFound, Store

log = logging.getLogger(__name__)
RETRY_INTERVAL = 1.0


async def finalize(store: Store, registry: Registry, namespace: str) -> bool:
    """One pass; True when the namespace is gone."""
    remaining = 0
    seen_prefixes: set[str] = set()
    for info in registry.all():
        if not info.namespaced:
            continue
        prefix = info.key(namespace)
        if prefix in seen_prefixes:
            continue
        seen_prefixes.add(prefix)
        res = await store.list(prefix)
        for obj in res.items:
            md = obj["metadata"]
            if md.get("deletionTimestamp") and md.get("finalizers"):
                remaining += 1
                continue
            try:
                _, removed = await store.delete(info.key(namespace, md["name"]))
            except KeyNotFound:
                continue
            if not removed:
                remaining += 1
    if remaining:
        return False
    try:
        await store.delete(meta.store_key("", "namespaces", None, namespace))
    except KeyNotFound:
        pass
    return True


async def run(store: Store, registry: Registry, requests: trio.MemoryReceiveChannel,
              *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    pending: set[str] = set()
    res = await store.list(meta.store_key("", "namespaces", None))
    for ns in res.items:
        if ns["metadata"].get("deletionTimestamp"):
            pending.add(ns["metadata"]["name"])
    task_status.started()
    while True:
        with trio.move_on_after(RETRY_INTERVAL if pending else float("inf")):
            name = await requests.receive()
            pending.add(name)
        for name in sorted(pending):
            try:
                done = await finalize(store, registry, name)
            except Exception:  # keep finalizing other namespaces; retry this one later
                log.exception("finalizing namespace %s", name)
                done = False
            if done:
                pending.discard(name)
