"""Shared plumbing for the benchmarks: start/stop a Fleet server, talk to it, record results.

Every benchmark runs the server as its own OS process (`python -m fleet.cli.main server`)
in a throw-away data directory, and generates load from *other* processes
(`bench.loadgen`), so the load generator never competes with the server for the
same interpreter lock.  All traffic goes to 127.0.0.1.

Results are written as JSON to `bench/results/<name>.json` (gitignored) and carry the
machine description, because this is a shared, noisy 2-core box: numbers are only
meaningful as ratios against a baseline measured in the same run.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PYTHON = sys.executable

# Extra arguments for `fleet server`, e.g. FLEET_BENCH_SERVER_ARGS="--no-agent".
SERVER_EXTRA_ARGS = os.environ.get("FLEET_BENCH_SERVER_ARGS", "").split()


# --------------------------------------------------------------------------- machine / results


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        nproc = os.cpu_count() or 0
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "nproc": nproc,
        "cpu": cpu_model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m_at_record": load1,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "machine": machine_info(), **data}
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def replace_doc_section(doc: Path, block: str, begin: str, end: str, heading: str) -> None:
    """Put `block` (which starts with `begin` and ends with `end`) in place of the
    section between those markers in `doc`, or append it under `## heading`."""
    text = doc.read_text()
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + block + "\n"
    doc.write_text(text)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no data."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def summarize_ms(latencies_s: list[float]) -> dict[str, Any]:
    """p50/p90/p99/max in milliseconds of a list of latencies in seconds."""
    ms = [x * 1000.0 for x in latencies_s]
    out: dict[str, Any] = {"n": len(ms)}
    for p in (50, 90, 99):
        v = percentile(ms, p)
        out[f"p{p}_ms"] = None if v is None else round(v, 3)
    out["max_ms"] = round(max(ms), 3) if ms else None
    out["mean_ms"] = round(sum(ms) / len(ms), 3) if ms else None
    return out


def raise_nofile_limit(want: int = 65536) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `want` (bounded by the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- RSS


def rss_kib(pid: int) -> int | None:
    """VmRSS of one process in KiB, or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


def rss_mb(pid: int) -> dict[str, float | None]:
    """RSS of the server process itself and of its whole process tree, in MB (10^6 bytes)."""
    own = rss_kib(pid)
    tree = [rss_kib(p) for p in process_tree(pid)]
    total = sum(x for x in tree if x)
    return {
        "rss_mb": None if own is None else round(own * 1024 / 1e6, 1),
        "rss_tree_mb": round(total * 1024 / 1e6, 1),
        "processes": len(tree),
    }


def cpu_s(pid: int) -> float | None:
    """User+system CPU seconds used so far by pid and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total, seen = 0.0, False
    for p in process_tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            seen = True
    return round(total, 2) if seen else None


# --------------------------------------------------------------------------- server


@dataclass
class ServerInfo:
    """Enough to talk to a server; JSON-able into loadgen arguments."""

    base_url: str
    token: str | None
    ca_pem: str | None = None  # the kubeconfig's certificate-authority-data, for https
    # A client certificate and key (PEM) to authenticate with instead of the token.
    client_cert_pem: str | None = None
    client_key_pem: str | None = None

    def as_args(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "token": self.token, "ca_pem": self.ca_pem,
                "client_cert_pem": self.client_cert_pem, "client_key_pem": self.client_key_pem}

    def verify(self) -> ssl.SSLContext | bool:
        return tls_verify(self.ca_pem, self.client_cert_pem, self.client_key_pem)


def tls_verify(ca_pem: str | None, cert_pem: str | None = None,
               key_pem: str | None = None) -> ssl.SSLContext | bool:
    """The httpx `verify` for a server whose CA is `ca_pem` (None: plain http), presenting
    the client certificate `cert_pem`/`key_pem` when given."""
    if not ca_pem:
        return False
    ctx = ssl.create_default_context(cadata=ca_pem)
    if cert_pem and key_pem:
        # ssl loads certificate chains only from files: a private temporary directory.
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = os.path.join(tmp, "c.pem"), os.path.join(tmp, "k.pem")
            for path, data in ((cert, cert_pem), (key, key_pem)):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                    f.write(data)
            ctx.load_cert_chain(cert, key)
    return ctx


def read_kubeconfig(path: Path) -> ServerInfo:
    import yaml

    cfg = yaml.safe_load(path.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    user = (cfg.get("users") or [{}])[0].get("user") or {}
    ca = cluster.get("certificate-authority-data")
    ca_pem = base64.b64decode(ca).decode() if ca else None
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    return ServerInfo(base_url=cluster["server"].rstrip("/"), token=user.get("token"), ca_pem=ca_pem,
                      client_cert_pem=base64.b64decode(cert).decode() if cert else None,
                      client_key_pem=base64.b64decode(key).decode() if key else None)


@dataclass
class FleetServer:
    """A `fleet server` child process in a temporary data directory.

    Use as a context manager; it is stopped (SIGTERM, then SIGKILL by pid) on exit and its
    data directory removed unless `keep` is set.
    """

    startup_timeout: float = 90.0
    keep: bool = False
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fleet-bench-")))
    port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = None
    info: ServerInfo | None = None
    startup_s: float | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self) -> FleetServer:
        import httpx

        self.port = self.port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        cmd = [
            PYTHON, "-m", "fleet.cli.main", "server",
            "--data-dir", str(self.data_dir / "data"),
            "--port", str(self.port),
            "--metrics-port", str(self.metrics_port),
            "--no-agent",  # the API benchmarks measure the control plane alone
            *SERVER_EXTRA_ARGS,
            *self.extra_args,
        ]  # fmt: skip
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._log = log
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a ^C to the bench must not hit the server first
            preexec_fn=_child_raise_nofile,
        )
        kubeconfig = self.data_dir / "data" / "admin.kubeconfig"
        deadline = t0 + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"fleet server exited with {self.proc.returncode}; log:\n{self.tail_log()}"
                )
            if kubeconfig.exists() and self.info is None:
                with contextlib.suppress(Exception):
                    self.info = read_kubeconfig(kubeconfig)
            if self.info is not None:
                with contextlib.suppress(httpx.HTTPError):
                    r = httpx.get(
                        self.info.base_url + "/readyz",
                        headers=auth_headers(self.info.token),
                        verify=self.info.verify(),
                        timeout=2.0,
                    )
                    if r.status_code == 200:
                        self.startup_s = time.monotonic() - t0
                        return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"fleet server not ready in {self.startup_timeout}s; log:\n{self.tail_log()}")

    def tail_log(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with contextlib.suppress(Exception):
            self._log.close()
        if not self.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return self.proc.returncode

    def __enter__(self) -> FleetServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _child_raise_nofile() -> None:
    # Runs in the server child before exec: 1,000 watchers need > 1,024 descriptors.
    raise_nofile_limit()


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def sync_client(info: ServerInfo, timeout: float = 30.0):
    import httpx

    return httpx.Client(
        base_url=info.base_url, headers=auth_headers(info.token), verify=info.verify(), timeout=timeout
    )


def configmap(name: str, namespace: str = "default", size: int = 64) -> dict[str, Any]:
    """A small ConfigMap (~`size` bytes of data)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "fleet"}},
        "data": {"payload": "x" * size},
    }


def ensure_namespace(info: ServerInfo, name: str) -> None:
    """Create namespace `name` if the server knows Namespaces; tolerate 409 and missing kind."""
    if name == "default":
        return
    with sync_client(info) as c:
        r = c.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if r.status_code not in (200, 201, 202, 409):
            raise RuntimeError(f"creating namespace {name}: {r.status_code} {r.text[:300]}")


def bulk_create(info: ServerInfo, namespace: str, names: list[str], concurrency: int = 20,
                collection: str | None = None, template: dict[str, Any] | None = None) -> None:
    """Create objects quickly (setup, not measured) through a thread pool of sync clients:
    ConfigMaps, or copies of `template` POSTed to `collection`."""
    from concurrent.futures import ThreadPoolExecutor

    path = collection or f"/api/v1/namespaces/{namespace}/configmaps"

    def body(n: str) -> dict[str, Any]:
        if template is None:
            return configmap(n, namespace)
        return {**template, "metadata": {**template.get("metadata", {}), "name": n, "namespace": namespace}}

    def one(chunk: list[str]) -> None:
        with sync_client(info) as c:
            for n in chunk:
                r = c.post(path, json=body(n))
                if r.status_code not in (200, 201, 409):
                    raise RuntimeError(f"setup create {n}: {r.status_code} {r.text[:300]}")

    chunks = [names[i::concurrency] for i in range(concurrency)]
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, [c for c in chunks if c]))


# --------------------------------------------------------------------------- load generator processes


def run_loadgen(specs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Run one `bench.loadgen` process per spec concurrently; return their JSON results.

    Each process gets its spec as JSON on the command line and prints its result as the
    last line of stdout.  Processes still running after `timeout` are killed by pid.
    """
    procs = [spawn_loadgen(s) for s in specs]
    return [finish_loadgen(p, timeout) for p in procs]


def spawn_loadgen(spec: dict[str, Any]) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-m", "bench.loadgen", json.dumps(spec)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_child_raise_nofile,
    )


def finish_loadgen(p: subprocess.Popen, timeout: float) -> dict[str, Any]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        out, err = p.communicate(timeout=10)
        return {"error": f"loadgen pid {p.pid} killed after {timeout}s", "stderr": err[-2000:]}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": f"loadgen exit {p.returncode}", "stderr": err[-2000:]}
    return json.loads(lines[-1])


def merge_closed_loop(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate closed-loop results of several loadgen processes (throughput over the union window)."""
    errs = [r["error"] for r in results if "error" in r]
    good = [r for r in results if "error" not in r]
    ok = sum(r["ok"] for r in good)
    failed = sum(r["failed"] for r in good)
    lat = [x for r in good for x in r["latencies"]]
    if good:
        start = min(r["t_start"] for r in good)
        end = max(r["t_end"] for r in good)
    else:
        start = end = 0.0
    wall = max(end - start, 1e-9)
    statuses: dict[str, int] = {}
    for r in good:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    return {
        "processes": len(results),
        "ok": ok,
        "failed": failed,
        "statuses": statuses,
        "wall_s": round(wall, 3),
        "ok_per_s": round(ok / wall, 1),
        "latency": summarize_ms(lat),
        "client_cpu_s": round(sum(r.get("cpu_s", 0.0) for r in good), 2),
        "errors": errs + [e for r in good for e in r.get("sample_errors", [])][:10],
    }


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- profiling (optional)


def start_profiler(pid: int, seconds: float, out: Path) -> subprocess.Popen | None:
    """Sample `pid` with py-spy (if installed) for `seconds`, writing collapsed stacks to `out`.

    py-spy is not a project dependency; install it by hand (`pip install py-spy`).
    `--nonblocking` keeps the sampling overhead off the server.
    """
    exe = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    if not Path(exe).exists():
        log("py-spy not found; not profiling")
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200", "--nonblocking", "--gil",
         "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def summarize_profile(raw: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive share of samples per function from py-spy's collapsed stacks."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [_frame_name(f) for f in stack.split(";")]
        if frames:
            self_n[frames[-1]] = self_n.get(frames[-1], 0) + count
        for f in set(frames):
            incl_n[f] = incl_n.get(f, 0) + count

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    buckets: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            b = _bucket(stack)
            buckets[b] = buckets.get(b, 0) + int(n)
    return {
        "samples": total,
        "buckets_pct": share(buckets),
        "self_pct": share(self_n),
        "inclusive_pct": share(incl_n),
    }


# First match wins: a rough split of where the server's CPU (GIL-holding samples) goes.
_BUCKETS = (
    # Worker threads start in threading.py or trio's thread cache; a stack without them is
    # the trio thread, even when py-spy only caught the coroutine part of it.
    ("worker threads (SQLite, to_thread)", lambda s: "(threading.py" in s or "WorkerThread._work" in s),
    ("TLS", lambda s: "(ssl.py" in s or "/ssl.py" in s or "_ssl.py" in s),
    ("thread hand-off on the trio thread", lambda s: "to_thread_run_sync" in s or "start_thread_soon" in s),
    ("watch streams", lambda s: "server/watch.py" in s),
    ("Fleet request pipeline (server/, store/, api/)", lambda s: "APIServer.handle" in s),
    ("Quart (ASGI framework)", lambda s: "quart" in s),
    ("Hypercorn + h11 (HTTP/1.1)", lambda s: "hypercorn/" in s or "h11/" in s),
    ("trio scheduler and other", lambda s: True),
)


def _bucket(stack: str) -> str:
    return next(name for name, pred in _BUCKETS if pred(stack))


def _frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)": merge lines of one function.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    short = "/".join(parts[-2:]) if len(parts) >= 2 else where
    return f"{name} ({short})"
