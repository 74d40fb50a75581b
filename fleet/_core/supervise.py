"""Supervision: long-running components restart instead of taking the process down.

Kubernetes' rule is that no stored object can crash kube-controller-manager or
the scheduler: they log, skip and carry on.  Two layers give us that:

* `supervise(name, fn, ...)` runs one component (the scheduler, the controller
  manager, the built-in agent, a cache loop).  If it raises anything but a
  cancellation, the exception is logged with the component's name, counted in
  `fleet_component_restarts_total{component=...}` and the component is started
  again after an exponential back-off (1 s doubling to 60 s; back to 1 s once a
  run has stayed up `healthy_after` seconds).  Without this an exception climbs
  the Trio nurseries and ends `fleet server` — and a poisoned object in the store
  then crashes every restart the same way.
* `object_failed(component, kind, key, exc)` is what the shared machinery
  (informer dispatch, work-queue workers, the scheduling cycle, the agent's pod
  sync) calls when handling ONE object raised: one log line naming the object
  and a count in `fleet_object_errors_total{component=..., kind=...}`; the caller
  then skips (or re-queues) that object and goes on with the others.

The counters live in this module's own `REGISTRY` (the process-wide one, since a
component may restart many times but the process has one set of counters); the
API server's /metrics includes it (fleet.server.metrics).

Times come from Trio (`trio.sleep`, `trio.current_time`), so the back-off is
tested under `trio.testing.MockClock(autojump_threshold=0)` with no real sleeps.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)
T = TypeVar("T")

REGISTRY = CollectorRegistry()
COMPONENT_RESTARTS = Counter(
    "fleet_component_restarts", "Times a supervised component raised and was restarted.",
    ["component"], registry=REGISTRY)
OBJECT_ERRORS = Counter(
    "fleet_object_errors", "Objects a component could not handle (logged and skipped or re-queued).",
    ["component", "kind"], registry=REGISTRY)


@dataclass(frozen=True)
class Backoff:
    """Restart delays: `initial * 2**n` after the n-th consecutive failure, capped at
    `maximum`; a run that stayed up `healthy_after` seconds resets the count (a
    component that fails once a day should not wait a minute to come back)."""

    initial: float = 1.0
    maximum: float = 60.0
    healthy_after: float = 60.0

    def delay(self, consecutive_failures: int) -> float:
        """The wait before the restart that follows `consecutive_failures` (>= 1) failures."""
        return min(self.initial * (2 ** max(0, consecutive_failures - 1)), self.maximum)


DEFAULT_BACKOFF = Backoff()


def restarts(component: str) -> float:
    """How often `component` has been restarted in this process (tests, debugging)."""
    return REGISTRY.get_sample_value("fleet_component_restarts_total", {"component": component}) or 0.0


def object_errors(component: str, kind: str) -> float:
    """How many objects of `kind` `component` failed to handle in this process."""
    return REGISTRY.get_sample_value("fleet_object_errors_total", {"component": component, "kind": kind}) or 0.0


def object_failed(component: str, kind: str, key: str, exc: BaseException, *,
                  action: str = "skipping it", logger: logging.Logger | None = None,
                  level: int = logging.WARNING) -> None:
    """Report that handling one object raised: one log line with the object's key,
    and a count.  The caller decides what happens to the object (skip, re-queue)."""
    OBJECT_ERRORS.labels(component, kind or "unknown").inc()
    # The traceback only at debug: a malformed object re-listed after every
    # reconnect would otherwise print a screenful each time, and the type and
    # message of the exception already tell what field was wrong.
    (logger or log).log(level, "%s: %s %s could not be handled (%s): %r", component, kind or "object",
                        key or "<no name>", action, exc, exc_info=(logger or log).isEnabledFor(logging.DEBUG))


async def retry(what: str, fn: Callable[[], Awaitable[T]], errors: tuple[type[BaseException], ...], *,
                backoff: Backoff = DEFAULT_BACKOFF, logger: logging.Logger | None = None) -> T:
    """`await fn()` until it returns: each of `errors` is logged (naming `what`) and
    retried after the back-off; any other exception propagates."""
    failures = 0
    while True:
        try:
            return await fn()
        except errors as e:
            failures += 1
            wait = backoff.delay(failures)
            (logger or log).warning("%s: %s; retrying in %.0fs", what, e, wait)
            await trio.sleep(wait)


def unwrap(exc: BaseException) -> BaseException:
    """The one exception inside nested one-member groups (what a nursery wraps a task's
    error in), for log lines that should say what failed, not "1 sub-exception"."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def supervise(name: str, fn: Callable[..., Awaitable[Any]], *args: Any,
                    backoff: Backoff = DEFAULT_BACKOFF, uses_task_status: bool = True,
                    retry_start: bool = True,
                    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """Run `fn(*args)` as the component `name` until cancelled, restarting it when it raises.

    With `uses_task_status` (the default), `fn` is `nursery.start`-ed: our own
    `task_status.started(value)` fires with the value of its *first* successful
    start, so `await nursery.start(supervise, "x", fn)` still waits until the
    component is ready.  A failure before that first start is retried like any
    other (the caller keeps waiting), since the usual cause — the API not
    answering yet, an object that breaks the first list — is the very thing
    supervision is for; with `retry_start=False` it propagates instead (a
    standalone process should exit on a bad flag or a port in use, not retry it
    forever).  Later restarts' start values are dropped.  Without
    `uses_task_status`, `fn` counts as started as soon as it is running.

    `fn` returning normally ends supervision: a component that decides it is done
    is not a failure.  Cancellation (and KeyboardInterrupt/SystemExit, or an
    exception group holding any of them) is never caught: shutdown stays shutdown.
    """
    started = False
    failures = 0
    while True:
        up_since: float | None = None
        try:
            async with trio.open_nursery() as nursery:
                if uses_task_status:
                    value = await nursery.start(fn, *args)
                else:
                    nursery.start_soon(fn, *args)
                    value = None
                up_since = trio.current_time()
                if not started:
                    started = True
                    task_status.started(value)
            return
        # `except Exception` is exactly the rule above: Cancelled is a BaseException,
        # and a group holding a Cancelled is a BaseExceptionGroup, so neither lands here.
        except Exception as exc:  # noqa: BLE001 - the point of a supervisor
            if not started and not retry_start:
                raise
            if up_since is not None and trio.current_time() - up_since >= backoff.healthy_after:
                failures = 0
            failures += 1
            delay = backoff.delay(failures)
            COMPONENT_RESTARTS.labels(name).inc()
            log.error("component %s failed (%d in a row): %r; restarting in %.0fs", name, failures,
                      unwrap(exc), delay, exc_info=exc)
        await trio.sleep(delay)
