"""Take typing's and logging's run-time cost out of celpy's interpreter.

celpy's evaluator writes `cast(Tuple[Result, lark.Token], ...)` in its hot paths;
each subscription builds (and hashes) a typing object on every AST node it
visits, which was over half the time of a typical admission expression.  The
names are looked up in the module's globals at call time, so replacing them with
an object whose subscription is free (and which still answers `isinstance` as the
real one, for the two places celpy checks with them) changes no behaviour.

Its loggers are called (at debug level) several times per node; their `debug`
becomes a no-op (info and above still log).  And an error's repr, which dumps the
expression's tree, must not fail on fleet/cel's simplified trees.
"""

from __future__ import annotations

import logging
from typing import Any

import celpy.evaluation as _evaluation


class _Free:
    """Subscription returns itself; isinstance defers to the real generic."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getitem__(self, _key: Any) -> _Free:
        return self

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self.real)


class _Quiet:
    """A logger whose debug() does nothing."""

    def __init__(self, real: logging.Logger) -> None:
        self.real = real

    def debug(self, *_args: Any, **_kw: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _cast(_type: Any, value: Any) -> Any:
    return value


def install() -> None:
    """Patch celpy.evaluation once (idempotent)."""
    if getattr(_evaluation, "_fleet_speedup", False):
        return
    import collections.abc as abc

    real = {"Sequence": abc.Sequence, "Mapping": abc.Mapping, "Iterable": abc.Iterable,
            "Dict": dict, "List": list, "Tuple": tuple, "Callable": abc.Callable}
    for name in ("Dict", "Iterable", "List", "Sequence", "Tuple", "Mapping", "Callable"):
        if hasattr(_evaluation, name):
            setattr(_evaluation, name, _Free(real[name]))
    for name in ("Union", "Optional", "Type"):
        if hasattr(_evaluation, name):
            setattr(_evaluation, name, _Free(object))
    _evaluation.cast = _cast  # type: ignore[assignment]
    # CELEvalError's repr dumps its tree back to CEL text; the dumper expects the grammar's
    # full tree, and fleet/cel compiles to a simplified one (engine._collapse).
    _dump = _evaluation.tree_dump

    def tree_dump(ast: Any) -> str:
        try:
            return str(_dump(ast))
        except Exception:  # noqa: BLE001 - only a description
            return "<expression>"
    _evaluation.tree_dump = tree_dump  # type: ignore[assignment]
    _evaluation.logger = _Quiet(_evaluation.logger)  # type: ignore[assignment]
    for cls in (_evaluation.NameContainer, _evaluation.Evaluator):
        cls.logger = _Quiet(cls.logger)  # type: ignore[assignment]
    _evaluation._fleet_speedup = True  # type: ignore[attr-defined]
