"""`fleet secrets rotate`: re-encrypt every stored object of the encrypted
resources under the current write key, with the server running.

Why through the API, not the database: the running server owns the store (one
writer, its revision counter, the watch cache), so an offline pass over the file
would have to stop it.  An unchanged PUT of every object is what Kubernetes
documents (`kubectl get secrets -A -o json | kubectl replace -f -`): the store
writes each as a new revision, sealed by the *first* provider of the current
config, while clients keep reading and writing (no downtime; a concurrent
change makes our PUT conflict, and we re-read and retry, so nobody's write is
lost).  Run it after adding a new key at the front of the provider list and
restarting the server with that config; the older keys can be removed from the
config once it has finished and history older than the rewrite was compacted.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import cyclopts
import trio

app = cyclopts.App(name="secrets", help="Secrets encryption at rest.")

CONFLICT_RETRIES = 5


def _resources_of(config: Path | None) -> list[str]:
    if config is None:
        return ["secrets"]
    from fleet.store.encryption import load_config

    codec = load_config(config)
    return [r for rule in codec.rules for r in rule.resources]


async def _targets(c: Any, names: list[str]) -> list[Any]:
    """Discovery's resources each config name stands for (wildcards expanded)."""
    served = [r for r in await c.discover() if r.preferred and r.has_verb("list") and r.has_verb("update")]
    out: list[Any] = []
    for name in names:
        res, _, group = name.partition(".")
        for r in served:
            if (group == "*" or r.group == group) and res in ("*", r.name) and r not in out:
                out.append(r)
    return out


async def rotate_all(c: Any, names: list[str], echo: Any = print) -> int:
    """Rewrite every object of `names`; returns how many were rewritten."""
    from fleet.client import ApiException

    total = 0
    for r in await _targets(c, names):
        done = 0
        listing = await c.list_all(r.api_version, r.name)
        for item in listing.get("items") or []:
            md = item.get("metadata") or {}
            name, ns = md.get("name"), md.get("namespace") if r.namespaced else None
            obj = item
            for attempt in range(CONFLICT_RETRIES + 1):
                obj.setdefault("apiVersion", r.api_version)
                obj.setdefault("kind", r.kind)
                try:
                    await c.replace(r.api_version, r.name, name, obj, ns)
                    done += 1
                    break
                except ApiException as e:
                    if e.code == 404:
                        break  # deleted meanwhile: nothing left to re-encrypt
                    if e.code != 409 or attempt == CONFLICT_RETRIES:
                        raise
                    # Someone wrote it meanwhile (their write is sealed by the current key
                    # already); re-read and rewrite anyway, so the count is exact.
                    try:
                        obj = await c.get_object(r.api_version, r.name, name, ns)
                    except ApiException as e2:
                        if e2.code == 404:
                            break
                        raise
        echo(f"{r.group_resource}: {done} rewritten")
        total += done
    return total


@app.command
def rotate(
    *,
    kubeconfig: Annotated[str | None, cyclopts.Parameter(help="Admin kubeconfig.")] = None,
    encryption_provider_config: Annotated[Path | None, cyclopts.Parameter(
        help="The server's EncryptionConfiguration: rewrite every resource it lists "
             "(default: secrets).")] = None,
    resources: Annotated[str | None, cyclopts.Parameter(
        help="Comma-separated resources to rewrite instead, e.g. secrets,configmaps.")] = None,
) -> None:
    """Re-encrypt every stored object under the current write key (the server keeps serving)."""
    from fleet.client import ApiException, Client, KubeconfigError, load_kubeconfig
    from fleet.store.encryption import EncryptionConfigError

    try:
        names = ([r.strip() for r in resources.split(",") if r.strip()] if resources
                 else _resources_of(encryption_provider_config))
    except EncryptionConfigError as e:
        sys.exit(f"fleet secrets rotate: {e}")

    async def main() -> int:
        async with Client(load_kubeconfig(kubeconfig), user_agent="fleet-secrets") as c:
            return await rotate_all(c, names)

    try:
        total = trio.run(main)
    except (ApiException, KubeconfigError) as e:
        sys.exit(f"fleet secrets rotate: {e}")
    print(f"{total} objects rewritten under the current write key")
