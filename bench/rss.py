"""Server memory: VmRSS of the `fleet server` process at idle after start-up and after load.

`python -m bench.rss [--settle 5]`

Standalone it starts a server, reads its RSS after `--settle` idle seconds, runs the
creates, latency and watch fan-out benchmarks against that same server, lets it settle
again and reads its RSS once more.  (`bench.run_all` does the same as part of the full
run.)  The baseline is a bare interpreter that has only imported the server's frameworks
(trio, hypercorn, quart-trio, sqlite3, PyYAML): the floor no server written on them can go
under.  Target: <= 100 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
from typing import Any

from bench.common import PYTHON, FleetServer, log, rss_mb, write_results

TARGET_MB = 100.0

FRAMEWORKS = "import trio, hypercorn.trio, quart_trio, sqlite3, yaml, json"


def framework_floor_mb() -> float | None:
    """RSS of a Python process that imported the server's frameworks and nothing else."""
    code = f"{FRAMEWORKS}; import time; print('READY', flush=True); time.sleep(60)"
    p = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "READY":
            return None
        time.sleep(0.5)
        return rss_mb(p.pid)["rss_mb"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=10)


def idle_rss(srv: FleetServer, settle: float = 5.0) -> dict[str, Any]:
    time.sleep(settle)
    r = rss_mb(srv.pid)
    r["settle_s"] = settle
    return r


def main() -> None:
    from bench import creates, latency, watch_fanout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settle", type=float, default=5.0)
    a = ap.parse_args()
    floor = framework_floor_mb()
    with FleetServer() as srv:
        idle = idle_rss(srv, a.settle)
        log(f"rss idle after start-up: {idle}")
        creates.run(srv)
        latency.run(srv)
        watch_fanout.run(srv)
        after = idle_rss(srv, a.settle)
        log(f"rss idle after load: {after}")
    write_results("rss", {"framework_floor_mb": floor, "idle_after_startup": idle,
                          "idle_after_load": after, "target_mb": TARGET_MB})


if __name__ == "__main__":
    main()
