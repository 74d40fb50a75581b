"""The resource metrics API (`metrics.k8s.io/v1beta1`), served by the API server itself.

In Kubernetes this is metrics-server, an aggregated API server: it scrapes
every kubelet's `/metrics/resource` on a fixed resolution (15 s), keeps the
last two scrapes per node in memory, derives cpu rates from them and answers
`NodeMetrics` / `PodMetrics` get and list — what `kubectl top` and the HPA
read.  Fleet does the same inside the API server, so there is nothing extra
to deploy:

    every `resolution` seconds, for every node that is not simulated:
        GET https://{node InternalIP}:{kubelet port}/metrics/resource   (the agent, the
            server's client certificate — the same address and credentials nodes/{name}/proxy uses)
        parse the Prometheus text: cumulative cpu seconds, working-set bytes,
            container start times, each with the agent's millisecond timestamp
        cpu usage = (cpu now - cpu before) / (time now - time before), window = that time
        a node that cannot be scraped loses its metrics until two scrapes succeed again

Rates come from two scrapes of the same counters, timed by the agent's own
clock, so neither network delay nor clock skew between machines bends them,
and the first metrics of a node or container appear one resolution after it
is first seen (as with metrics-server).  A container restart (new start
time) or a counter going backwards restarts its series.  A pod is reported
only when every running container of it has a rate, so an average is never
taken over half a pod.

Simulated nodes have no agent to scrape.  Their pods' usage is what the pods
declare in the `fleet.dev/simulate-cpu` / `fleet.dev/simulate-memory`
annotations (fleet/api/kinds/metrics.py), computed when a request asks, with
the request's time as timestamp and the resolution as window; a simulated
node's usage is the sum over its running pods.  Nothing is scraped for them,
so thousands of simulated nodes cost nothing until someone asks.

Requests: `get` and `list` of `nodes` and (namespaced or across namespaces)
`pods`, with label selectors on the *objects'* labels (a PodMetrics carries
its pod's labels, as metrics-server copies them) and field selectors on
`metadata.name` / `metadata.namespace`; tables for `kubectl get`.  The
objects exist only for nodes and pods that exist now: a pod deleted since the
last scrape disappears at once.

The scraping (parsing, rates, the scrape loop and what it keeps) is
`metrics_scraper.py`; this module answers the requests from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleet.api import errors, meta, selectors
from fleet.api.kinds import metrics as mk
from fleet.api.registry import KindInfo
from fleet.server.http import Req, Resp
from fleet.server.metrics_scraper import MetricsScraper, _rfc3339_ms
from fleet.server.tables import table, wants_table
from fleet.store import KeyNotFound


class ResourceMetrics(MetricsScraper):
    """Scrapes the agents and answers the `metrics.k8s.io` requests (see the module docstring).

    `run` is a service of `fleet server` (started in run.py); `serve` is called
    by the API for every request in the group, after authorization.
    """

    def _kind(self, group: str, version: str, plural: str) -> KindInfo:
        info = self.registry.get(group, version, plural)
        assert info is not None, f"{plural} is not registered"
        return info

    async def serve(self, info: KindInfo, namespace: str | None, name: str | None,
                    req: Req) -> Resp:
        """GET of one object (`name`) or a list, for `nodes` or `pods` of the group."""
        now = meta.now_rfc3339()
        if info.plural == "nodes":
            objs = await self._node_metrics(name, req, now)
        else:
            objs = await self._pod_metrics(namespace, name, req, now)
        if name is not None:
            if not objs:
                raise errors.NotFound(f'{info.plural}.{info.group} "{name}" not found',
                                      name=name, group=info.group, kind=info.plural)
            if wants_table(req.headers.get("accept", "")):
                return Resp.json(200, table(info, objs, include=req.query.get("includeObject",
                                                                               "Metadata")))
            return Resp.json(200, objs[0])
        if wants_table(req.headers.get("accept", "")):
            return Resp.json(200, table(info, objs, include=req.query.get("includeObject",
                                                                           "Metadata")))
        return Resp.json(200, {"kind": info.list_kind, "apiVersion": info.api_version,
                               "metadata": {}, "items": objs})

    def _selected(self, info: KindInfo, objs: Iterable[dict[str, Any]],
                  req: Req) -> list[dict[str, Any]]:
        ls = selectors.parse_label_selector(req.query.get("labelSelector", ""))
        fs = selectors.parse_field_selector(req.query.get("fieldSelector", ""),
                                            info.field_selectable)
        return [o for o in objs if ls.matches((o.get("metadata") or {}).get("labels"))
                and fs.matches(o)]

    async def _node_metrics(self, name: str | None, req: Req, now: str) -> list[dict[str, Any]]:
        info = self._kind(mk.GROUP, mk.VERSION, "nodes")
        if name is not None:
            nodes = [self.nodes[name]] if name in self.nodes else []
        else:
            nodes = self._selected(info, sorted(self.nodes.values(),
                                                key=lambda n: n["metadata"]["name"]), req)
        simulated: dict[str, tuple[int, int]] = {}
        if any(mk.is_simulated_node(n) for n in nodes):
            for pod in await self._pods_in(None):
                node_name = (pod.get("spec") or {}).get("nodeName")
                if node_name and (pod.get("status") or {}).get("phase") == "Running":
                    cpu, mem = simulated.get(node_name, (0, 0))
                    for _, c, m in mk.simulated_usage(pod):
                        cpu, mem = cpu + c, mem + m
                    simulated[node_name] = (cpu, mem)
        out = []
        for node in nodes:
            n = node["metadata"]["name"]
            if mk.is_simulated_node(node):
                cpu, mem = simulated.get(n, (0, 0))
                out.append(mk.node_metrics(node, cpu, mem, timestamp=now,
                                           window=self.resolution, now=now))
            elif n in self._node_usage:
                u = self._node_usage[n]
                out.append(mk.node_metrics(node, u.cpu_nanocores, u.memory_bytes,
                                           timestamp=_rfc3339_ms(u.ts_ms), window=u.window,
                                           now=now))
        return out

    async def _pods_in(self, namespace: str | None) -> list[dict[str, Any]]:
        res = await self.store.list(self._kind("", "v1", "pods").key(namespace))
        return res.items

    async def _pod_metrics(self, namespace: str | None, name: str | None, req: Req,
                           now: str) -> list[dict[str, Any]]:
        info = self._kind(mk.GROUP, mk.VERSION, "pods")
        if name is not None:
            assert namespace is not None
            try:
                pods = [await self.store.get(self._kind("", "v1", "pods").key(namespace, name))]
            except KeyNotFound:
                pods = []
        else:
            pods = self._selected(info, await self._pods_in(namespace), req)
        out = []
        for pod in pods:
            md = pod.get("metadata") or {}
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name:
                continue
            if mk.is_simulated_node(self.nodes.get(node_name)):
                if (pod.get("status") or {}).get("phase") != "Running":
                    continue
                out.append(mk.pod_metrics(pod, mk.simulated_usage(pod), timestamp=now,
                                          window=self.resolution, now=now))
                continue
            u = self._pods.get((md.get("namespace", ""), md.get("name", "")))
            if u is None or u.node != node_name:
                continue  # not measured yet, or a pod of the same name measured elsewhere
            out.append(mk.pod_metrics(pod, list(u.containers), timestamp=_rfc3339_ms(u.ts_ms),
                                      window=u.window, now=now))
        return out


__all__ = ["ResourceMetrics"]
