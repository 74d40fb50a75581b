"""From one rendered proxy table to the next: the smallest atomic `nft -f` transaction.

`fleet.network.proxy_rules` renders the whole desired table; applying it whole on
every change would re-create every chain (and empty every affinity set) for one
endpoint that moved.  `diff(old, new)` instead lists only what differs, as operations
(`Op`), in an order the kernel accepts inside a single transaction:

1. new sets/maps, new chains (empty, so anything below may reference them);
2. map/set elements that go or change value are deleted (they may point at chains
   that are about to go);
3. chains whose rules change, that go, or that use a set being re-created are flushed;
4. chains that go are deleted, then sets that go (or change declaration);
   re-declared sets are added back;
5. the rules of new and changed chains are added, then the new or changed elements.

A per-service chain is only ever rewritten whole (flush + its rules), like
kube-proxy's; unchanged chains, elements and sets are not mentioned at all, so a
one-endpoint change touches that one service's chains and elements only.

`hold_chain_deletes` postpones deleting the chains that go (flushed at once) to a
later transaction, for kernels before 6.2 (see there).

`full(new)` is the first sync: `add table; delete table; add table` followed by
`diff(EMPTY, new)` — the table is replaced atomically, never seen half built.
A change to the skeleton (table name, hooks, the fixed maps) also takes `full`.

`script(ops)` is the nft text; `apply_ops(table, ops)` is a strict model of what nft
does with it (refusing what the kernel would refuse: deleting a chain that still has
rules or is still jumped to, adding an element twice...), so the unit tests can check
`apply_ops(a, diff(a, b)) == b` for any two renderings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleet.network.proxy_rules import Chain, SetDecl, Table, skeleton


@dataclass(frozen=True)
class Op:
    """One nft command.  `verb`: add/flush/delete; `what`: table/chain/set/rule/element."""

    verb: str
    what: str
    name: str = ""
    arg: str = ""  # the hook, the set declaration, the rule text, or the element key
    value: str = ""  # an element's value ("" for set elements); "map"/"set" for sets


def _refs(text: str) -> set[str]:
    """Chains and sets a rule or verdict names (jump/goto X, @X)."""
    return set(re.findall(r"(?:jump|goto) ([^\s,}]+)", text)) | set(re.findall(r"@([^\s,}]+)", text))


def diff(old: Table, new: Table) -> list[Op]:
    """Operations turning `old` into `new` (requires equal skeletons; see `needs_full`)."""
    ops: list[Op] = []
    old_sets, new_sets = old.sets, new.sets
    redeclared = {n for n in old_sets.keys() & new_sets.keys() if old_sets[n] != new_sets[n]}
    gone_sets = old_sets.keys() - new_sets.keys()
    # 1. new sets and chains
    for name in sorted(new_sets.keys() - old_sets.keys()):
        ops.append(Op("add", "set", name, new_sets[name].body, new_sets[name].kind))
    for name in sorted(new.chains.keys() - old.chains.keys()):
        ops.append(Op("add", "chain", name, new.chains[name].hook or ""))
    # 2. elements that go or change
    adds: list[Op] = []
    for sname in sorted(old.elements.keys() | new.elements.keys()):
        before = old.elements.get(sname, {})
        after = new.elements.get(sname, {})
        if sname in gone_sets or sname in redeclared:
            # The set itself goes (and takes its elements) or is re-created empty.
            for key in sorted(after):
                adds.append(Op("add", "element", sname, key, after[key]))
            continue
        for key in sorted(before):
            if key not in after or after[key] != before[key]:
                ops.append(Op("delete", "element", sname, key))
        for key in sorted(after):
            if key not in before or after[key] != before[key]:
                adds.append(Op("add", "element", sname, key, after[key]))
    # 3. flush changed, removed and set-dependent chains
    touched_sets = redeclared | gone_sets
    rewrite: list[str] = []
    for name in sorted(old.chains.keys()):
        oc, nc = old.chains[name], new.chains.get(name)
        if nc is not None and nc.rules == oc.rules and not (
                touched_sets and any(_refs(r) & touched_sets for r in oc.rules)):
            continue
        if oc.rules:
            ops.append(Op("flush", "chain", name))
        if nc is not None and nc.rules:
            rewrite.append(name)
    # 4. delete chains and sets that go; re-declare changed sets
    for name in sorted(old.chains.keys() - new.chains.keys()):
        ops.append(Op("delete", "chain", name))
    for name in sorted(gone_sets | redeclared):
        ops.append(Op("delete", "set", name, value=old_sets[name].kind))
    for name in sorted(redeclared):
        ops.append(Op("add", "set", name, new_sets[name].body, new_sets[name].kind))
    # 5. rules, then elements
    rewrite += sorted(n for n in new.chains.keys() - old.chains.keys() if new.chains[n].rules)
    for name in rewrite:
        for rule in new.chains[name].rules:
            ops.append(Op("add", "rule", name, rule))
    ops.extend(adds)
    return ops


def needs_full(old: Table | None, new: Table) -> bool:
    """True when `new` cannot be reached from `old` by `diff` (none yet, or a new skeleton)."""
    return old is None or skeleton(old) != skeleton(new)


def full(new: Table) -> list[Op]:
    """Replace the table wholesale, atomically (the first sync after start)."""
    return [Op("add", "table"), Op("delete", "table"), Op("add", "table"),
            *diff(Table(new.name, new.family), new)]


def hold_chain_deletes(ops: Sequence[Op], new: Table, stale: dict[str, float], now: float,
                       grace: float) -> tuple[list[Op], Table, dict[str, float]]:
    """Keep per-service chains that go for `grace` seconds before deleting them.

    Kernels before 6.2 only notice a little after a transaction that a chain is no
    longer referenced by a map element, and refuse to delete it in that transaction
    (kube-proxy's "stale chains").  So a chain that goes is flushed at once (nothing
    reaches it any more) but deleted by a later transaction, `grace` seconds after it
    was first found stale.  Returns the operations to run, the table the kernel then
    holds (`new` plus the held, empty chains: the next `diff` starts from it) and the
    chains still held, with the time each became stale."""
    out: list[Op] = []
    held: dict[str, float] = {}
    for op in ops:
        if (op.verb, op.what) == ("delete", "chain") and "/" in op.name:
            since = stale.get(op.name, now)
            if now - since < grace:
                held[op.name] = since
                continue
        out.append(op)
    if not held:
        return out, new, held
    applied = new.copy()
    for name in held:
        applied.chains[name] = Chain(())
    return out, applied, held


def touched(ops: Iterable[Op]) -> set[str]:
    """Names of the chains and sets an operation list touches (for tests and logs)."""
    return {op.name for op in ops if op.what in ("chain", "rule", "set")}


# --------------------------------------------------------------------------- nft text


def script(table: Table, ops: Sequence[Op]) -> str:
    """The `nft -f` text of `ops` on `table` (element operations on one set batched)."""
    fam, tname = table.family, table.name
    out: list[str] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if op.what == "element":
            # Consecutive element operations on the same set: one command.
            j = i
            items = []
            while j < len(ops) and (ops[j].what, ops[j].verb, ops[j].name) == ("element", op.verb, op.name):
                e = ops[j]
                items.append(f"{e.arg} : {e.value}" if (op.verb == "add" and e.value) else e.arg)
                j += 1
            out.append(f"{op.verb} element {fam} {tname} {op.name} {{ {', '.join(items)} }}")
            i = j
            continue
        if op.what == "table":
            out.append(f"{op.verb} table {fam} {tname}")
        elif op.what == "chain":
            hook = f" {{ {op.arg} }}" if op.verb == "add" and op.arg else ""
            out.append(f"{op.verb} chain {fam} {tname} {op.name}{hook}")
        elif op.what == "set":
            body = f" {{ {op.arg} }}" if op.verb == "add" else ""
            out.append(f"{op.verb} {op.value or 'set'} {fam} {tname} {op.name}{body}")
        elif op.what == "rule":
            out.append(f"add rule {fam} {tname} {op.name} {op.arg}")
        else:  # pragma: no cover - every Op is built here
            raise ValueError(f"unknown op {op}")
        i += 1
    return "\n".join(out) + ("\n" if out else "")


# --------------------------------------------------------------------------- a strict model


class TransactionError(ValueError):
    """What nft would refuse (the model's verdict on an operation list)."""


def apply_ops(table: Table, ops: Iterable[Op]) -> Table:
    """`ops` applied to a copy of `table` — refusing, as nft does, what is inconsistent."""
    t = table.copy()
    for op in ops:
        if op.what == "table":
            if op.verb == "delete":
                t = Table(t.name, t.family)
            continue
        if op.what == "set":
            if op.verb == "add":
                if op.name in t.sets:
                    raise TransactionError(f"set {op.name} exists")
                t.sets[op.name] = SetDecl(op.value, op.arg)
                t.elements[op.name] = {}
            else:
                if op.name not in t.sets:
                    raise TransactionError(f"set {op.name} does not exist")
                users = [c for c, ch in t.chains.items() for r in ch.rules if op.name in _refs(r)]
                if users:
                    raise TransactionError(f"set {op.name} is in use by {users}")
                del t.sets[op.name]
                t.elements.pop(op.name, None)
        elif op.what == "chain":
            if op.verb == "add":
                if op.name in t.chains:
                    raise TransactionError(f"chain {op.name} exists")
                t.chains[op.name] = Chain((), op.arg or None)
            elif op.verb == "flush":
                if op.name not in t.chains:
                    raise TransactionError(f"chain {op.name} does not exist")
                t.chains[op.name] = Chain((), t.chains[op.name].hook)
            else:
                if op.name not in t.chains:
                    raise TransactionError(f"chain {op.name} does not exist")
                if t.chains[op.name].rules:
                    raise TransactionError(f"chain {op.name} is not empty")
                users = [c for c, ch in t.chains.items() for r in ch.rules if op.name in _refs(r)]
                users += [s for s, els in t.elements.items() for v in els.values() if op.name in _refs(v)]
                if users:
                    raise TransactionError(f"chain {op.name} is in use by {users}")
                del t.chains[op.name]
        elif op.what == "rule":
            if op.name not in t.chains:
                raise TransactionError(f"chain {op.name} does not exist")
            missing = [r for r in _refs(op.arg) if r not in t.chains and r not in t.sets]
            if missing:
                raise TransactionError(f"rule in {op.name} names missing {missing}")
            c = t.chains[op.name]
            t.chains[op.name] = Chain((*c.rules, op.arg), c.hook)
        elif op.what == "element":
            if op.name not in t.sets:
                raise TransactionError(f"set {op.name} does not exist")
            els = t.elements.setdefault(op.name, {})
            if op.verb == "add":
                if op.arg in els:
                    raise TransactionError(f"element {op.arg} of {op.name} exists")
                missing = [r for r in _refs(op.value) if r not in t.chains]
                if missing:
                    raise TransactionError(f"element {op.arg} names missing {missing}")
                els[op.arg] = op.value
            else:
                if op.arg not in els:
                    raise TransactionError(f"element {op.arg} of {op.name} does not exist")
                del els[op.arg]
    return t


__all__ = [
    "Op",
    "TransactionError",
    "apply_ops",
    "diff",
    "full",
    "hold_chain_deletes",
    "needs_full",
    "script",
    "touched",
]
