"""Generate fleet/api/k8s_names.json: each type of k8s_schema.json -> the name Kubernetes gives it.

fleet/api/k8s_schema.json names types as the official Python client does (`V1Pod`,
`CoreV1Event`, `V1ObjectMeta`), which drops the Go package.  `/openapi/v2` names its definitions
as kube-apiserver does (`io.k8s.api.core.v1.Pod`, `io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta`),
so the package has to come from somewhere: kubectl carries the protobuf file descriptors of
k8s.io/api and apimachinery (gzipped `FileDescriptorProto`s), whose package names are exactly
Kubernetes' OpenAPI prefixes (`k8s.io.api.core.v1` -> `io.k8s.api.core.v1`).

A Python name is `[Group]V<version><Kind>`; the group prefix appears only where the kind is
ambiguous across groups (`CoreV1Event` vs `EventsV1Event`).  A type kubectl does not know (newer
than kubectl, or the hand-written Gateway API tables) takes its package from the type that refers
to it, and a root from its API group (a CRD-style name for Gateway API: the reversed group, as
apiextensions-apiserver names CRD definitions).

Run: python packaging/gen_k8s_names.py [path/to/kubectl]
"""

from __future__ import annotations

import json
import re
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

_GZIP = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"
_NAME = re.compile(r"^([A-Z][a-z]+(?:[A-Z][a-z]+)*?)?(V\d+(?:alpha\d+|beta\d+)?)([A-Z].*)$")


def _varint(b: bytes, i: int) -> tuple[int, int]:
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def _fields(b: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        wire = key & 7
        v: bytes | int
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 2:
            n, i = _varint(b, i)
            v = b[i:i + n]
            i += n
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type")
        yield key >> 3, wire, v


def kubectl_packages(binary: bytes) -> dict[str, set[str]]:
    """proto package -> top-level message names, from the descriptors compiled into kubectl."""
    out: dict[str, set[str]] = {}
    for m in re.finditer(re.escape(_GZIP), binary):
        try:
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(binary[m.start():m.start() + 2_000_000])
            fields = list(_fields(raw))
        except (zlib.error, ValueError, IndexError):
            continue
        name = pkg = None
        msgs: list[str] = []
        for num, wire, v in fields:
            if wire != 2 or not isinstance(v, bytes):
                continue
            if num == 1:
                name = v
            elif num == 2:
                pkg = v.decode(errors="replace")
            elif num == 4:
                for n2, _, v2 in _fields(v):
                    if n2 == 1 and isinstance(v2, bytes):
                        msgs.append(v2.decode())
                        break
        if pkg and pkg.startswith("k8s.io.") and msgs and name and name.endswith(b".proto"):
            out.setdefault(pkg, set()).update(msgs)
    return out


def _group_package(group: str, version: str, pkgs: dict[str, set[str]]) -> str:
    if group in ("", "core"):
        return f"io.k8s.api.core.{version}"
    if group == "meta.k8s.io":
        return f"io.k8s.apimachinery.pkg.apis.meta.{version}"
    if group == "apiregistration.k8s.io":  # kube-aggregator's types (not in kubectl's descriptors)
        return f"io.k8s.kube-aggregator.pkg.apis.apiregistration.{version}"
    first = group.split(".")[0]
    if any(p.startswith(f"k8s.io.api.{first}.") for p in pkgs):
        return f"io.k8s.api.{first}.{version}"
    return ".".join(reversed(group.split("."))) + "." + version  # a CRD-style (reversed) group


def _refs(expr: object) -> list[str]:
    if isinstance(expr, str):
        return []
    assert isinstance(expr, dict)
    if "ref" in expr:
        return [expr["ref"]]
    return _refs(expr.get("list") or expr.get("map"))


def names(schema: dict, pkgs: dict[str, set[str]]) -> dict[str, str]:
    types = schema["types"]
    known: dict[str, list[str]] = {}
    for t in types:
        m = _NAME.match(t)
        if not m:
            continue
        prefix, version, kind = m.groups()
        cands = [p for p, ms in pkgs.items() if p.endswith("." + version.lower()) and kind in ms]
        if prefix:
            cands = [p for p in cands if p.split(".")[-2] == prefix.lower()]
        known[t] = ["io.k8s." + p.removeprefix("k8s.io.") for p in cands]
    out: dict[str, str] = {}

    def assign(t: str, parent_pkg: str) -> None:
        m = _NAME.match(t)
        kind = m.group(3) if m else t
        cands = known.get(t, [])
        if len(cands) == 1:
            pkg = cands[0]
        elif parent_pkg in cands or (not cands and parent_pkg):
            # Not in kubectl: the referrer's group, at the version the type's own name gives.
            pkg = parent_pkg.rsplit(".", 1)[0] + "." + m.group(2).lower() if m else parent_pkg
        else:
            pkg = cands[0]
        out[t] = f"{pkg}.{kind}"

    # Breadth-first from the roots, so a type takes the package of its nearest referrer.
    todo: list[tuple[str, str]] = []
    for r in schema["roots"]:
        todo.append((r["type"], _group_package(r["group"], r["version"], pkgs)))
    while todo:
        nxt: list[tuple[str, str]] = []
        for t, parent in todo:
            if t in out:
                continue
            assign(t, parent)
            pkg = out[t].rsplit(".", 1)[0]
            for f in types[t]["fields"].values():
                nxt.extend((c, pkg) for c in _refs(f["type"]))
        todo = nxt
    for t in types:  # unreachable from any root: only what kubectl says
        if t not in out and len(known.get(t, [])) == 1:
            assign(t, "")
    return out


def main() -> None:
    kubectl = Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/bin/kubectl")
    root = Path(__file__).resolve().parent.parent / "fleet" / "api"
    schema = json.loads((root / "k8s_schema.json").read_text())
    out = names(schema, kubectl_packages(kubectl.read_bytes()))
    (root / "k8s_names.json").write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"{len(out)} of {len(schema['types'])} types named")


if __name__ == "__main__":
    main()
