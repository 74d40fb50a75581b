"""DefaultTolerationSeconds: every pod tolerates a dead node for a while (300 s by default).

When a node stops heartbeating, the node lifecycle controller taints it
`node.kubernetes.io/unreachable:NoExecute` (or `not-ready`), and NoExecute
evicts every pod that does not tolerate the taint.  A network blip would then
restart the whole node's workload at once; this plugin gives each pod a
bounded toleration for both taints instead, so pods ride out short outages
and are evicted — and replaced elsewhere by their controllers — only once the
outage outlasts `tolerationSeconds`.

Exactly kube-apiserver's plugin (plugin/pkg/admission/defaulttolerationseconds):
pods on create and update, not their subresources; a toleration is added only
when the pod does not already tolerate the taint — a toleration with that key
or an empty key (all keys), and effect NoExecute or empty (all effects).  The
durations are `--default-not-ready-toleration-seconds` and
`--default-unreachable-toleration-seconds` there; here they are
`ServerConfig.default_not_ready_toleration_seconds` and
`default_unreachable_toleration_seconds`.
"""

from __future__ import annotations

from typing import Any

from fleet.auth import Attributes, UserInfo

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
DEFAULT_SECONDS = 300


def _tolerates(tolerations: list[Any], key: str) -> bool:
    """Whether some toleration already covers `key`:NoExecute (kube-apiserver's test)."""
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        if t.get("key") in (key, "", None) and t.get("effect") in ("NoExecute", "", None):
            return True
    return False


class DefaultTolerationSeconds:
    """Mutating admission plugin; see the module docstring."""

    name = "DefaultTolerationSeconds"

    def __init__(self, not_ready_seconds: int = DEFAULT_SECONDS,
                 unreachable_seconds: int = DEFAULT_SECONDS) -> None:
        self.not_ready_seconds = not_ready_seconds
        self.unreachable_seconds = unreachable_seconds

    async def mutate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any],
                     old: dict[str, Any] | None) -> dict[str, Any]:
        if (attrs.group, attrs.resource) != ("", "pods") or attrs.subresource:
            return obj
        if attrs.verb not in ("create", "update", "patch"):
            return obj
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return obj  # validation reports it
        tolerations = spec.get("tolerations")
        if tolerations is None:
            tolerations = []
        if not isinstance(tolerations, list):
            return obj
        added = []
        for key, seconds in ((NOT_READY_TAINT, self.not_ready_seconds),
                             (UNREACHABLE_TAINT, self.unreachable_seconds)):
            if not _tolerates(tolerations, key):
                added.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                              "tolerationSeconds": seconds})
        if added:
            spec["tolerations"] = [*tolerations, *added]
        return obj
