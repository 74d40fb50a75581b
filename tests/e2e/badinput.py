"""What every bad-input suite shares: counting requests, what a refusal is, and the end check.

The bad-input suite (tests/e2e/test_bad_input.py) and the authorization-aware fuzzing
modules (tests/e2e/test_fuzz_*.py) each run one real `fleet server` and send it
hostile requests.  Each module keeps one `Tally`: every request goes through
`Tally.send` (or is counted with `Tally.count` when it was sent some other way), so
the report at module teardown says how many requests of which class got which
status.  `refused` is what a clean refusal looks like (a 4xx carrying a Kubernetes
`Status`), and `assert_server_healthy` is the end check every module makes: the
process is alive, answers /readyz and a normal create/get/delete, sent no 5xx that
the module did not expect, and logged no internal error or traceback.

Reports: `Tally.report()` prints the counts and, when $FLEET_BAD_INPUT_REPORT names
a file, merges them into it under the suite's name (a JSON object of suites), so
one run of all the modules leaves one file docs/reliability.md quotes.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from typing import Any

import httpx


class Tally:
    """Requests sent by one suite: status histogram, the hostile ones apart, by class."""

    def __init__(self, suite: str) -> None:
        self.suite = suite
        self.hist: Counter[int] = Counter()
        self.hostile: Counter[int] = Counter()  # the attacking requests only (not the controls)
        self.by_class: Counter[str] = Counter()

    def count(self, what: str, status: int) -> None:
        self.hist[status] += 1
        if what != "control":
            self.hostile[status] += 1
        self.by_class[what] += 1

    def send(self, c: httpx.Client, what: str, method: str, path: str, *, body: bytes | None = None,
             ctype: str = "application/json", params: dict[str, str] | None = None,
             headers: dict[str, str] | None = None, timeout: float = 30.0) -> httpx.Response:
        """One request; the bound is per request, so a hang fails the test, not the suite."""
        h = {"Content-Type": ctype} if body is not None else {}
        h.update(headers or {})
        r = c.request(method, path, content=body, headers=h, params=params, timeout=timeout)
        self.count(what, r.status_code)
        return r

    def summary(self) -> dict[str, Any]:
        return {"requests": sum(self.hist.values()),
                "status": {str(k): v for k, v in sorted(self.hist.items())},
                "hostile_requests": sum(self.hostile.values()),
                "hostile_status": {str(k): v for k, v in sorted(self.hostile.items())},
                "by_class": dict(sorted(self.by_class.items()))}

    def report(self) -> None:
        summary = self.summary()
        print(f"\n{self.suite} suite:", json.dumps(summary))
        out = os.environ.get("FLEET_BAD_INPUT_REPORT")
        if not out:
            return
        try:
            with open(out) as f:
                suites = json.load(f)
            if not isinstance(suites, dict):
                suites = {}
        except (OSError, ValueError):
            suites = {}
        suites[self.suite] = summary
        with open(out, "w") as f:
            json.dump(suites, f, indent=2)


def refused(r: httpx.Response, *codes: int) -> dict[str, Any]:
    """A 4xx (one of `codes` if given) carrying a Kubernetes Status."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:600])
    if codes:
        assert r.status_code in codes, (r.status_code, r.text[:600])
    body = r.json()
    assert body["kind"] == "Status" and body["status"] == "Failure", body
    assert body["code"] == r.status_code and body.get("reason"), body
    return body


def assert_log_clean(output: str) -> None:
    """The server logged no internal error and no traceback."""
    assert "internal error on" not in output, output[output.find("internal error on") - 200:][:3000]
    assert "Traceback" not in output, output[output.find("Traceback"):][:3000]


def assert_server_healthy(c: httpx.Client, srv: Any, tally: Tally, namespace: str, *,
                          expected_5xx: int = 0) -> None:
    """The end check: alive, ready, serves a normal create/get/delete in `namespace`,
    sent no more 5xx than the suite expected (kube's own, such as a failed webhook
    call), and logged nothing internal."""
    assert srv.proc.poll() is None, "the server exited"
    assert tally.send(c, "control", "GET", "/readyz").status_code == 200
    name = f"still-serving-{uuid.uuid4().hex[:6]}"
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}
    r = tally.send(c, "control", "POST", path, body=json.dumps(body).encode())
    assert r.status_code == 201, r.text
    assert tally.send(c, "control", "GET", f"{path}/{name}").status_code == 200
    assert tally.send(c, "control", "DELETE", f"{path}/{name}").status_code == 200
    assert tally.send(c, "control", "GET", f"{path}/{name}").status_code == 404
    five = sum(n for code, n in tally.hist.items() if code >= 500)
    assert five == expected_5xx, (five, expected_5xx, tally.hist)
    assert_log_clean(srv.output())


def ok(tally: Tally, r: httpx.Response) -> dict[str, Any]:
    """A control request that must succeed (200/201); its JSON body."""
    tally.count("control", r.status_code)
    assert r.status_code in (200, 201), (r.status_code, r.text[:600])
    return r.json()


def low_privilege_service_account(admin: httpx.Client, tally: Tally, namespace: str, name: str) -> str:
    """Create `namespace` and a ServiceAccount in it whose only grant is get/list on
    configmaps there (a Role and RoleBinding); its bearer token from the TokenRequest API."""
    ok(tally, admin.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": namespace}}))
    ok(tally, admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                         json={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}))
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    ok(tally, admin.post(f"{rbac}/roles", json={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}))
    ok(tally, admin.post(f"{rbac}/rolebindings", json={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "cm-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}))
    tr = ok(tally, admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                              json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                    "spec": {"expirationSeconds": 3600}}))
    return str(tr["status"]["token"])


def raw_request(url: str, ctx: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
                body: bytes = b"", timeout: float = 20.0) -> httpx.Response:
    """One HTTP/1.1 request written byte for byte (header values an HTTP client would
    refuse to send: trailing blanks, raw non-ASCII, control characters) over TLS when
    `url` is https; the answer read to the end of the connection.  A connection the
    server closes without an answer is a status 0 response (not a crash: the caller
    decides)."""
    import socket
    import ssl

    u = httpx.URL(url)
    head = [f"{method} {path} HTTP/1.1".encode(), f"Host: {u.host}:{u.port}".encode(), b"Connection: close",
            f"Content-Length: {len(body)}".encode()]
    head += [k + b": " + v for k, v in headers]
    data = b"\r\n".join(head) + b"\r\n\r\n" + body
    with socket.create_connection((u.host, u.port or 443), timeout=timeout) as s:
        conn: Any = s
        if u.scheme == "https":
            assert isinstance(ctx, ssl.SSLContext)
            conn = ctx.wrap_socket(s, server_hostname=u.host)
        chunks = []
        try:
            conn.sendall(data)
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, ssl.SSLEOFError, BrokenPipeError):
            pass
    raw = b"".join(chunks)
    if not raw:
        return httpx.Response(0)
    head_raw, _, rest = raw.partition(b"\r\n\r\n")
    lines = head_raw.split(b"\r\n")
    status = int(lines[0].split()[1])
    hdrs = [tuple(x.strip() for x in line.split(b":", 1)) for line in lines[1:] if b":" in line]
    if any(k.lower() == b"transfer-encoding" and b"chunked" in v.lower() for k, v in hdrs):
        out, buf = b"", rest
        while buf:
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, buf = out + buf[:size], buf[size + 2:]
        rest = out
    return httpx.Response(status, headers=[(k, v) for k, v in hdrs
                                           if k.lower() not in (b"transfer-encoding", b"content-encoding")],
                          content=rest)
