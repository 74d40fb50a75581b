"""Prometheus metrics of the API server and its store (served on --metrics-port).

Request counts and latency histograms are labelled by verb, resource and
code like kube-apiserver's `apiserver_request_*`; store and watch numbers are
read when scraped, so they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from fleet._core import supervise

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _StoreCollector:
    def __init__(self, stats: Callable[[], dict[str, Any]], watchers: Callable[[], int]) -> None:
        self._stats = stats
        self._watchers = watchers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._stats()
        for name, key, doc in (
            ("fleet_store_revision", "revision", "Current revision of the store (the newest resourceVersion)."),
            ("fleet_store_compacted_revision", "compacted_revision", "Revision below which history is compacted."),
            ("fleet_store_db_bytes", "db_bytes", "Size of the SQLite database file in bytes."),
            ("fleet_store_wal_bytes", "wal_bytes", "Size of the SQLite write-ahead log in bytes."),
            ("fleet_store_keys", "keys", "Live objects in the store."),
        ):
            if key in s and s[key] is not None:
                yield GaugeMetricFamily(name, doc, value=float(s[key]))
        yield GaugeMetricFamily("fleet_apiserver_watches", "Open watch streams served by the API server.",
                                value=float(self._watchers()))


class _ProcessCollector:
    """The process-wide component counters (restarts, objects that failed to be
    handled; fleet._core.supervise), served beside the API server's own."""

    def collect(self) -> Iterator[Any]:
        yield from supervise.REGISTRY.collect()


class Metrics:
    def __init__(self, stats: Callable[[], dict[str, Any]], watchers: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("fleet_apiserver_request", "API requests by verb, resource and HTTP code.",
                                ["verb", "resource", "code"], registry=self.registry)
        self.latency = Histogram("fleet_apiserver_request_duration_seconds",
                                 "API request latency by verb, resource and HTTP code (watches: time to "
                                 "first byte).", ["verb", "resource", "code"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        # The audit log (fleet/auth/audit_log.py), kube-apiserver's names.
        self.audit_events = Counter("apiserver_audit_event", "Counter of audit events generated and "
                                    "sent to the audit backend.", registry=self.registry)
        self.audit_errors = Counter("apiserver_audit_error", "Counter of audit events that failed to be "
                                    "audited properly. Plugin identifies the plugin affected by the error.",
                                    ["plugin"], registry=self.registry)
        self.registry.register(_StoreCollector(stats, watchers))  # type: ignore[arg-type]
        self.registry.register(_ProcessCollector())  # type: ignore[arg-type]

    def observe(self, verb: str, resource: str, code: int, seconds: float) -> None:
        c = str(code)
        self.requests.labels(verb, resource, c).inc()
        self.latency.labels(verb, resource, c).observe(seconds)

    def audit_event(self) -> None:
        self.audit_events.inc()

    def audit_error(self, n: int) -> None:
        self.audit_errors.labels("log").inc(n)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
