"""A small nftables helper: load rulesets atomically, drop our own tables.

Fleet's rules live in tables of their own (`table ip fleet` for pod networking; the
services and policy code add theirs), never in anybody else's, so we can replace or
remove ours wholesale without reading or disturbing rules other software keeps.

Every change goes through one `nft -f -` invocation, which the kernel applies as a
single transaction: a reader (or a packet) sees the old table or the new one, never a
half-built one.  Replacing a table uses the standard idiom

    table ip fleet          # create it if missing, so the delete cannot fail
    delete table ip fleet
    table ip fleet { ... }  # the new contents

in that one transaction.  `nft` runs as a subprocess through `trio.run_process`, so
the event loop never waits on it; in another network namespace it runs under
`nsenter --net=PATH` (nftables state is per network namespace).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

import trio

NFT = "nft"
NSENTER = "nsenter"
FAMILIES = frozenset({"ip", "ip6", "inet", "arp", "bridge", "netdev"})


class NftError(RuntimeError):
    """`nft` refused a command; carries its stderr."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(f"{message}: {stderr.strip()}" if stderr else message)
        self.stderr = stderr


def nft_available() -> bool:
    """True if the `nft` binary is on PATH."""
    return shutil.which(NFT) is not None


def _argv(args: list[str], netns: str | None) -> list[str]:
    base = [NFT, *args]
    if netns is None:
        return base
    return [NSENTER, f"--net={netns}", *base]


def _check_ident(family: str, table: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown nftables family {family!r}")
    if not table.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"invalid nftables table name {table!r}")


def _output(args: list[str], returncode: int, stdout: bytes, stderr: bytes) -> str:
    if returncode != 0:
        raise NftError(f"nft {' '.join(args)} failed (exit {returncode})",
                       stderr.decode(errors="replace"))
    return stdout.decode(errors="replace")


async def run_nft(args: list[str], *, stdin: bytes | None = None, netns: str | None = None) -> str:
    """Run `nft ARGS` (in `netns` if given); returns stdout, raises NftError on failure."""
    argv = _argv(args, netns)
    try:
        proc = await trio.run_process(
            argv, stdin=stdin if stdin is not None else b"", capture_stdout=True,
            capture_stderr=True, check=False,
        )
    except FileNotFoundError as e:
        raise NftError(f"cannot run {argv[0]}: not installed") from e
    return _output(args, proc.returncode, proc.stdout, proc.stderr)


def run_nft_sync(args: list[str], *, stdin: bytes | None = None, netns: str | None = None) -> str:
    """`run_nft` for synchronous callers (a worker thread, `fleet killall`)."""
    argv = _argv(args, netns)
    try:
        proc = subprocess.run(argv, input=stdin if stdin is not None else b"",
                              capture_output=True, check=False)
    except FileNotFoundError as e:
        raise NftError(f"cannot run {argv[0]}: not installed") from e
    return _output(args, proc.returncode, proc.stdout, proc.stderr)


def _table_names(out: str) -> list[str]:
    doc = json.loads(out or '{"nftables": []}')
    return [str(item["table"].get("name")) for item in doc.get("nftables", [])
            if isinstance(item.get("table"), dict)]


def list_tables_sync(family: str, *, netns: str | None = None) -> list[str]:
    """Names of the `family` tables (synchronous)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown nftables family {family!r}")
    return _table_names(run_nft_sync(["-j", "list", "tables", family], netns=netns))


def delete_table_sync(family: str, table: str, *, netns: str | None = None) -> bool:
    """`delete_table` for synchronous callers: idempotent, returns whether it existed."""
    _check_ident(family, table)
    existed = table in list_tables_sync(family, netns=netns)
    run_nft_sync(["-f", "-"], stdin=f"table {family} {table}\ndelete table {family} {table}\n".encode(),
                 netns=netns)
    return existed


async def apply(ruleset: str | Mapping[str, Any], *, netns: str | None = None) -> None:
    """Load `ruleset` in one transaction: nft text syntax, or a libnftables JSON document
    (`{"nftables": [...]}`)."""
    if isinstance(ruleset, str):
        await run_nft(["-f", "-"], stdin=ruleset.encode(), netns=netns)
    else:
        await run_nft(["-j", "-f", "-"], stdin=json.dumps(ruleset).encode(), netns=netns)


def replace_table_script(family: str, table: str, body: str) -> str:
    """Text that atomically replaces table `family table` with one holding `body`."""
    _check_ident(family, table)
    return (
        f"table {family} {table}\n"
        f"delete table {family} {table}\n"
        f"table {family} {table} {{\n{body.rstrip()}\n}}\n"
    )


async def replace_table(family: str, table: str, body: str, *, netns: str | None = None) -> None:
    """Create or replace our table `family table` with `body`, atomically."""
    await apply(replace_table_script(family, table, body), netns=netns)


async def delete_table(family: str, table: str, *, netns: str | None = None) -> bool:
    """Delete our table if it exists; returns whether there was one (idempotent).

    Create-then-delete in one transaction, so "it was not there" is not an error and
    there is no window between a check and the delete.
    """
    _check_ident(family, table)
    existed = await table_exists(family, table, netns=netns)
    await apply(f"table {family} {table}\ndelete table {family} {table}\n", netns=netns)
    return existed


async def list_table(family: str, table: str, *, netns: str | None = None) -> str:
    """The table's rules in nft text syntax (for diagnostics and tests)."""
    _check_ident(family, table)
    return await run_nft(["list", "table", family, table], netns=netns)


async def table_exists(family: str, table: str, *, netns: str | None = None) -> bool:
    """True if `family table` exists."""
    _check_ident(family, table)
    return table in _table_names(await run_nft(["-j", "list", "tables", family], netns=netns))


__all__ = [
    "NftError",
    "apply",
    "delete_table",
    "delete_table_sync",
    "list_tables_sync",
    "run_nft_sync",
    "list_table",
    "nft_available",
    "replace_table",
    "replace_table_script",
    "run_nft",
    "table_exists",
]
