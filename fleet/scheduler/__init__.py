"""The scheduler: binds pending pods to nodes through `pods/binding`.

`framework` (statuses, CycleState, plugin protocols, the pipeline),
`snapshot` (nodes and what is committed on them), `plugins/` (one filter or
scorer per file), `queue` (active / back-off / unschedulable) and `run`
(the I/O loop).  The decision is pure; only `run` talks to the API.
"""

from fleet.scheduler.run import Scheduler, SchedulerConfig, run

__all__ = ["Scheduler", "SchedulerConfig", "run"]
