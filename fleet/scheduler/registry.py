"""The plugin registry: plugin names to factories, and profiles built from names and args.

A scheduler profile is a list of plugins plus score weights.  Operators
describe one by names and per-plugin args, as a KubeSchedulerConfiguration
profile does (`plugins.multiPoint.enabled/disabled`, `pluginConfig`), so
the registry maps each name to a factory taking the plugin's args in their
Kubernetes spelling (camelCase: `scoringStrategy`, `defaultConstraints`,
...).  Unknown names, unknown args and bad weights are errors at startup,
never silent no-ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet.scheduler.framework import Plugin, ScorePlugin
from fleet.scheduler.plugins import (
    DEFAULT_WEIGHTS,
    ImageLocality,
    InterPodAffinity,
    NodeAffinity,
    NodeName,
    NodePorts,
    NodeResourcesBalancedAllocation,
    NodeResourcesFit,
    NodeUnschedulable,
    PodTopologySpread,
    TaintToleration,
    VolumeBinding,
    default_plugins,
)

PluginFactory = Callable[[Mapping[str, Any]], Plugin]


def _without_args(cls: Callable[[], Plugin]) -> PluginFactory:
    def build(args: Mapping[str, Any]) -> Plugin:
        if args:
            raise ValueError(f"plugin {cls().name} takes no args, got {sorted(args)}")
        return cls()
    return build


REGISTRY: dict[str, PluginFactory] = {
    "NodeUnschedulable": _without_args(NodeUnschedulable),
    "NodeName": _without_args(NodeName),
    "TaintToleration": _without_args(TaintToleration),
    "NodeAffinity": NodeAffinity.from_args,
    "NodePorts": _without_args(NodePorts),
    "NodeResourcesFit": NodeResourcesFit.from_args,
    "VolumeBinding": _without_args(VolumeBinding),
    "PodTopologySpread": PodTopologySpread.from_args,
    "InterPodAffinity": InterPodAffinity.from_args,
    "NodeResourcesBalancedAllocation": NodeResourcesBalancedAllocation.from_args,
    "ImageLocality": _without_args(ImageLocality),
}

DEFAULT_PLUGIN_NAMES = tuple(p.name for p in default_plugins())


def build_profile(names: Iterable[str] | None = None, *, args: Mapping[str, Mapping[str, Any]] | None = None,
                  weights: Mapping[str, int] | None = None,
                  disabled: Iterable[str] = ()) -> tuple[list[Plugin], dict[str, int]]:
    """Plugins (in the given order) and score weights for a profile.

    `names` defaults to the default profile's plugins; `disabled` removes
    some (`"*"`: all defaults, so `names` lists the whole profile).  `args`
    maps a plugin name to its args; `weights` overrides score weights
    (defaults: kube-scheduler's, 1 for plugins it has no default for).
    """
    args = dict(args or {})
    off = set(disabled)
    if names is None:
        chosen = [] if "*" in off else [n for n in DEFAULT_PLUGIN_NAMES if n not in off]
    else:
        chosen = [n for n in names if n not in off]
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"plugin listed twice in profile: {chosen}")
    for name in list(args) + list(weights or {}):
        if name not in REGISTRY:
            raise ValueError(f"unknown scheduler plugin {name!r}")
    stray = set(args) - set(chosen)
    if stray:
        raise ValueError(f"args given for plugins not in the profile: {sorted(stray)}")
    plugins: list[Plugin] = []
    for name in chosen:
        factory = REGISTRY.get(name)
        if factory is None:
            raise ValueError(f"unknown scheduler plugin {name!r}")
        try:
            plugins.append(factory(args.get(name) or {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"plugin {name}: {e}") from None
    out_weights: dict[str, int] = {}
    for p in plugins:
        if isinstance(p, ScorePlugin):
            w = int((weights or {}).get(p.name, DEFAULT_WEIGHTS.get(p.name, 1)))
            if w < 1:
                raise ValueError(f"plugin {p.name}: score weight must be at least 1, not {w}")
            out_weights[p.name] = w
    return plugins, out_weights


def build_profile_from_config(profile: Mapping[str, Any]) -> tuple[list[Plugin], dict[str, int]]:
    """From a KubeSchedulerConfiguration profile: `plugins.multiPoint` (and `score` weights), `pluginConfig`.

    As in Kubernetes, `multiPoint.enabled` plugins are appended to the
    defaults (or replace them when `disabled` contains `"*"`), and a weight
    given with an enabled plugin overrides its default.
    """
    plugins_cfg = profile.get("plugins") or {}
    multi = plugins_cfg.get("multiPoint") or {}
    disabled = [d["name"] for d in multi.get("disabled") or []]
    enabled = multi.get("enabled") or []
    weights: dict[str, int] = {}
    for entry in list(enabled) + list((plugins_cfg.get("score") or {}).get("enabled") or []):
        if entry.get("weight"):
            weights[entry["name"]] = int(entry["weight"])
    names = [] if "*" in disabled else [n for n in DEFAULT_PLUGIN_NAMES if n not in disabled]
    names += [e["name"] for e in enabled if e["name"] not in names]
    # Typed args carry apiVersion/kind (NodeResourcesFitArgs, ...): not plugin settings.
    args = {c["name"]: {k: v for k, v in (c.get("args") or {}).items() if k not in ("apiVersion", "kind")}
            for c in profile.get("pluginConfig") or []}
    return build_profile(names, args=args, weights=weights)
