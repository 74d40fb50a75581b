"""An in-memory fake API server behind `httpx.MockTransport`, for client unit tests.

It serves the discovery documents of `fakes.py`, keeps objects in a dict by
path, applies merge and strategic merge patches with `fleet.api.patch`, and
records every request so tests can assert on what the client sent.  Tests
can queue canned responses (`fail_next`) to provoke conflicts and errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleet.api import patch as patchlib
from fleet.api import smp_schema
from fleet.client import Client, ClientConfig

from .fakes import DOCUMENTS


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


@dataclass
class FakeAPI:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)
    # (method, path) -> list of canned responses, consumed first-in first-out
    canned: dict[tuple[str, str], list[httpx.Response]] = field(default_factory=dict)
    revision: int = 100

    def fail_next(self, method: str, path: str, response: httpx.Response) -> None:
        self.canned.setdefault((method, path), []).append(response)

    def client(self) -> Client:
        cfg = ClientConfig(server="http://fake", token="secret")
        return Client(cfg, transport=httpx.MockTransport(self.handle))

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.revision += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        return obj

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        method = request.method
        queue = self.canned.get((method, path))
        if queue:
            return queue.pop(0)
        if method == "GET" and path in DOCUMENTS:
            return httpx.Response(200, json=DOCUMENTS[path])
        if method == "GET":
            if path in self.objects:
                return httpx.Response(200, json=self.objects[path])
            items = [o for p, o in self.objects.items() if p.rsplit("/", 1)[0] == path]
            if items or path.endswith("s"):
                return httpx.Response(200, json={"kind": "List", "items": items,
                                                 "metadata": {"resourceVersion":
                                                              str(self.revision)}})
            return httpx.Response(404, json=status(404, "NotFound", f"{path} not found"))
        if method == "POST":
            body = json.loads(request.content)
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return httpx.Response(409, json=status(409, "AlreadyExists", "exists"))
            body["metadata"]["uid"] = "uid-" + body["metadata"]["name"]
            self.objects[target] = self._bump(body)
            return httpx.Response(201, json=body)
        if method == "PATCH":
            if path not in self.objects:
                return httpx.Response(404, json=status(404, "NotFound", "not found"))
            live = self.objects[path]
            p = json.loads(request.content)
            ctype = request.headers["content-type"]
            if ctype == "application/strategic-merge-patch+json":
                new = patchlib.strategic_merge_patch(live, p, smp_schema.schema_for(live["kind"]))
            else:
                new = patchlib.json_merge_patch(live, p)
            self.objects[path] = self._bump(new)
            return httpx.Response(200, json=new)
        if method == "DELETE":
            obj = self.objects.pop(path, None)
            if obj is None:
                return httpx.Response(404, json=status(404, "NotFound", "not found"))
            return httpx.Response(200, json=obj)
        return httpx.Response(405, json=status(405, "MethodNotAllowed", "no"))
