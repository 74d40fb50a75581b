"""Read Kubernetes manifests from files, directories and stdin.

`kfleet apply -f` and `kfleet delete -f` accept what kubectl accepts: YAML or
JSON files, multi-document YAML (`---`), `kind: List` wrappers (flattened to
their items), directories (their `*.yaml`, `*.yml` and `*.json` files, sorted,
recursing only when asked) and `-` for stdin.  Empty documents are skipped.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(Exception):
    """A manifest could not be read or is not a Kubernetes object."""


@dataclass(frozen=True)
class Manifest:
    """One object and where it came from (for error messages)."""

    source: str
    obj: dict[str, Any]


def _flatten(doc: Any, source: str) -> list[Manifest]:
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise ManifestError(f"{source}: expected a mapping, got {type(doc).__name__}")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        out: list[Manifest] = []
        for item in doc["items"]:
            out.extend(_flatten(item, source))
        return out
    if not doc.get("apiVersion") or not kind:
        raise ManifestError(f"{source}: object is missing apiVersion or kind")
    if not (doc.get("metadata") or {}).get("name") and not (doc.get("metadata") or {}).get(
            "generateName"):
        raise ManifestError(f"{source}: {kind} has no metadata.name")
    return [Manifest(source, doc)]


def parse_manifest_text(text: str, source: str = "<string>") -> list[Manifest]:
    """All objects in a YAML/JSON text (YAML is a superset of JSON)."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ManifestError(f"error parsing {source}: {exc}") from exc
    out: list[Manifest] = []
    for doc in docs:
        out.extend(_flatten(doc, source))
    return out


def _dir_files(path: Path, recursive: bool) -> list[Path]:
    pattern = "**/*" if recursive else "*"
    return sorted(p for p in path.glob(pattern)
                  if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES)


def load_manifests(paths: list[str], *, recursive: bool = False,
                   stdin: TextIO | None = None) -> list[Manifest]:
    """Every object named by `paths`, in order."""
    out: list[Manifest] = []
    for raw in paths:
        if raw == "-":
            out.extend(parse_manifest_text((stdin or sys.stdin).read(), "STDIN"))
            continue
        path = Path(raw)
        if path.is_dir():
            files = _dir_files(path, recursive)
        elif path.exists():
            files = [path]
        else:
            raise ManifestError(f'the path "{raw}" does not exist')
        for f in files:
            try:
                text = f.read_text()
            except OSError as exc:
                raise ManifestError(f"cannot read {f}: {exc}") from exc
            out.extend(parse_manifest_text(text, str(f)))
    return out
