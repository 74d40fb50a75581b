"""Storage drivers by name: in-tree ones register at import, third-party ones from plugins.

`register(name, factory)` makes a driver known; `create(name, env)` builds an
instance for a place (`DriverEnv`: the server, or one node).  Plugins are Python
modules that call `register` when imported: `load_plugins(["my.module"])` (what
`fleet server/agent --storage-plugin my.module` does) and every entry point in the
`fleet.storage.drivers` group (an installed package's way), each a module or a
`module:callable` that registers.
"""

from __future__ import annotations

import importlib
import logging
import tempfile
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from fleet.storage.driver import Capabilities, Driver, DriverEnv

log = logging.getLogger(__name__)

Factory = Callable[[DriverEnv], Driver]

ENTRY_POINT_GROUP = "fleet.storage.drivers"
IN_TREE_MODULES = ("fleet.storage.hostpath", "fleet.storage.local")

_factories: dict[str, Factory] = {}
_capabilities: dict[str, Capabilities] = {}


def register(name: str, factory: Factory) -> None:
    """Make driver `name` available; registering the same name again replaces it."""
    _factories[name] = factory
    _capabilities.pop(name, None)


def unregister(name: str) -> None:
    _factories.pop(name, None)
    _capabilities.pop(name, None)


def names() -> list[str]:
    return sorted(_factories)


def known(name: str) -> bool:
    return name in _factories


def create(name: str, env: DriverEnv) -> Driver:
    """A new instance of driver `name` for `env`; KeyError when unknown."""
    return _factories[name](env)


def capabilities(name: str) -> Capabilities | None:
    """What driver `name` declares (None when unknown) — what the server's controllers
    read (node-local or not, attach required, capacity tracking) without running it.

    Taken from the factory itself when it carries a `capabilities` attribute (a driver
    class with class-level capabilities); otherwise from one instance made for the
    server (`DriverEnv` with a data dir that is never created: a driver must not touch
    it before a call), remembered until the name is registered again."""
    factory = _factories.get(name)
    if factory is None:
        return None
    caps = _capabilities.get(name)
    if caps is None:
        caps = getattr(factory, "capabilities", None)
        if not isinstance(caps, Capabilities):
            probe = Path(tempfile.gettempdir()) / "fleet-storage-capabilities" / name
            caps = factory(DriverEnv(data_dir=probe)).capabilities
        _capabilities[name] = caps
    return caps


def _load(spec: str) -> None:
    module, _, attr = spec.partition(":")
    mod = importlib.import_module(module)
    if attr:
        getattr(mod, attr)()


def load_plugins(modules: Iterable[str] = ()) -> None:
    """Import the in-tree drivers, the given plugin modules and the entry points.

    A plugin that fails to import is an error for the modules named explicitly (the
    operator asked for it) and a logged warning for entry points."""
    for spec in IN_TREE_MODULES:
        try:
            _load(spec)
        except ModuleNotFoundError as e:
            if e.name != spec:
                raise
    for spec in modules:
        _load(spec)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            _load(ep.value)
        except Exception:  # noqa: BLE001 - a broken installed plugin must not stop the node
            log.exception("storage plugin %s (%s) failed to load", ep.name, ep.value)


__all__ = ["ENTRY_POINT_GROUP", "Factory", "capabilities", "create", "known", "load_plugins", "names",
           "register", "unregister"]
