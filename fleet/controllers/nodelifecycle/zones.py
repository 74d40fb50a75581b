"""Zones: disruption states and the per-zone rate limits of NoExecute tainting.

`compute_zone_state` / `plan_disruption` are Kubernetes' ComputeZoneState and
handleDisruption over one monitor pass's Ready statuses (Normal, PartialDisruption,
FullDisruption, and the all-zones-down mode in which nothing is evicted);
`zone_rate` gives each zone's tainting rate and `TokenBucket` enforces it.  Pure:
times are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleet.controllers.nodelifecycle.common import (
    STATE_FULL,
    STATE_INITIAL,
    STATE_NORMAL,
    STATE_PARTIAL,
    NodeLifecycleConfig,
)


def compute_zone_state(statuses: Iterable[str | None], threshold: float) -> tuple[int, str]:
    """Kubernetes' ComputeZoneState: (not-ready count, state) for a zone's Ready statuses."""
    ready = not_ready = 0
    for s in statuses:
        if s == "True":
            ready += 1
        else:
            not_ready += 1
    if ready == 0 and not_ready > 0:
        return not_ready, STATE_FULL
    if not_ready > 2 and not_ready / (not_ready + ready) >= threshold:
        return not_ready, STATE_PARTIAL
    return not_ready, STATE_NORMAL


def zone_rate(state: str, size: int, cfg: NodeLifecycleConfig) -> float:
    """How fast nodes of a zone in `state` may be tainted NoExecute (nodes per second)."""
    if state == STATE_PARTIAL:
        return cfg.secondary_eviction_rate if size > cfg.large_cluster_size_threshold else 0.0
    # Normal, a fresh zone, and a fully disrupted zone while others are healthy
    # (that zone is what failed: move its pods elsewhere) all use the normal rate.
    return cfg.eviction_rate


@dataclass(frozen=True)
class DisruptionPlan:
    states: dict[str, str]
    rates: dict[str, float]
    all_disrupted: bool
    entered: bool  # every zone just became fully disrupted: remove NoExecute taints everywhere
    exited: bool  # some node is Ready again after that: give every node a fresh grace period


def plan_disruption(zone_statuses: Mapping[str, list[str | None]], previous: Mapping[str, str],
                    cfg: NodeLifecycleConfig) -> DisruptionPlan:
    """Kubernetes' handleDisruption over one pass's Ready statuses, per zone."""
    if not zone_statuses:
        # No node counts (none at all, or only excluded and registering ones): no
        # disruption to speak of, and nothing to stop.
        return DisruptionPlan({}, {}, False, False, False)
    new = {z: compute_zone_state(s, cfg.unhealthy_zone_threshold)[1] for z, s in zone_statuses.items()}
    all_are = all(s == STATE_FULL for s in new.values())
    # Zones seen for the first time start Initial, so they count as "not fully
    # disrupted before" (a cluster's first node coming up NotReady enters the mode).
    prev = {z: previous.get(z, STATE_INITIAL) for z in zone_statuses}
    all_were = all(s == STATE_FULL for s in prev.values())
    sizes = {z: len(s) for z, s in zone_statuses.items()}
    if all_are and all_were:
        return DisruptionPlan(dict(prev), {z: 0.0 for z in new}, True, False, False)
    if all_are:
        return DisruptionPlan({z: STATE_FULL for z in new}, {z: 0.0 for z in new}, True, True, False)
    rates = {z: zone_rate(s, sizes[z], cfg) for z, s in new.items()}
    return DisruptionPlan(new, rates, False, False, all_were)


class TokenBucket:
    """client-go's token bucket rate limiter: `rate` tokens a second, `burst` at most, starts full.

    A rate of 0 never grants (Kubernetes swaps in a "never" limiter to stop evictions).
    """

    def __init__(self, rate: float, now: float, burst: int = 1) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if self.rate > 0 and now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = max(self.stamp, now)

    def try_take(self, now: float) -> bool:
        self._refill(now)
        if self.rate <= 0 or self.tokens < 1.0 - 1e-9:
            return False
        self.tokens = max(0.0, self.tokens - 1.0)
        return True

    def next_time(self, now: float) -> float | None:
        """When the next token is there (None: never, at rate 0)."""
        self._refill(now)
        if self.rate <= 0:
            return None
        if self.tokens >= 1.0 - 1e-9:
            return now
        return now + (1.0 - self.tokens) / self.rate

    def refund(self) -> None:
        """Return a token whose work did not happen (a failed write)."""
        self.tokens = min(float(self.burst), self.tokens + 1.0)

    def set_rate(self, rate: float, now: float) -> None:
        if rate == self.rate:
            return
        self._refill(now)
        if self.rate <= 0 < rate:
            self.tokens = float(self.burst)  # as k8s' SwapLimiter: a fresh, full bucket
        self.rate = rate

