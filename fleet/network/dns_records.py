"""Cluster DNS records: what CoreDNS's kubernetes plugin answers, as a pure engine.

The Kubernetes DNS specification (kubernetes/dns docs/specification.md, schema 1.1.0)
in one class, fed from Services, EndpointSlices, Namespaces and (for verified pod
records) Pods, and asked `answer(qname, qtype)`.  No I/O and no wire format: the server
(`fleet.network.dns`) turns an `Answer` into a DNS message.

Names under the cluster domain (`<zone>`, default cluster.local):

* `<svc>.<ns>.svc.<zone>`: A/AAAA → the ClusterIP(s); a headless Service → its ready
  endpoint IPs (NXDOMAIN when it has none, as the spec says); ExternalName → CNAME.
* `<hostname>.<svc>.<ns>.svc.<zone>` (headless): the endpoint's `hostname` (a StatefulSet
  pod: `web-0.web.ns...`) or, without one, its dashed IP (`10-42-0-5`), CoreDNS's choice
  for the spec's "system-assigned identifier".
* `_<port>._<proto>.<svc>.<ns>.svc.<zone>` SRV for named ports: a ClusterIP Service
  → port number + the Service name; headless → one record per ready endpoint and
  matching port of its slice, target the endpoint's name (A records in additional).
* `<a>-<b>-<c>-<d>.<ns>.pod.<zone>` A (AAAA with dashed IPv6): "insecure" mode (the
  spec's deprecated record, kubeadm's default) answers any IP; "verified" only a pod of
  that namespace with that IP; "disabled" none.
* PTR (`in-addr.arpa` / `ip6.arpa`) for ClusterIPs and headless endpoint IPs; other
  reverse names fall through to the upstream resolvers (CoreDNS's `fallthrough`).
* `dns-version.<zone>` TXT "1.1.0"; SOA/NS at the apex.

A name that exists with no record of the asked type is NODATA (NOERROR, empty answer);
a name that does not exist is NXDOMAIN; both carry the zone's SOA in the authority
section.  Names outside the zone are `forward`.  All comparisons are case-insensitive
and answers carry the question's name as asked.

The engine keeps a derived view per Service, recomputed when the Service or one of
its slices changes, so a query is a few dict look-ups; `generation` moves on every
change (the server's answer cache is keyed by it).
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = "1.1.0"
DEFAULT_TTL = 5
POD_MODES = ("insecure", "verified", "disabled")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class RR:
    """One resource record. `data`: A/AAAA (ip,), CNAME/PTR/NS (target,), TXT (text,),
    SRV (priority, weight, port, target), SOA (mname, rname, serial, refresh, retry,
    expire, minimum). Names are absolute with a trailing dot."""

    name: str
    rtype: str
    ttl: int
    data: tuple[Any, ...]


@dataclass
class Answer:
    rcode: int = NOERROR
    answer: list[RR] = field(default_factory=list)
    authority: list[RR] = field(default_factory=list)
    additional: list[RR] = field(default_factory=list)
    # Not ours: ask the upstream resolvers.
    forward: bool = False
    # An ExternalName's target outside the cluster: resolve it upstream and append.
    chase: str | None = None


@dataclass(frozen=True)
class _Endpoint:
    hostname: str  # the endpoint's hostname or its dashed IP
    ip: str
    ports: tuple[tuple[str, str, int], ...]  # (name, protocol, port) of its slice


@dataclass
class _Service:
    namespace: str
    name: str
    headless: bool
    cluster_ips: tuple[str, ...]
    external_name: str
    ports: tuple[tuple[str, str, int], ...]  # named service ports (name, protocol, port)
    endpoints: tuple[_Endpoint, ...] = ()


def dashed(ip: str) -> str:
    """10.42.0.5 → 10-42-0-5; 2001:db8::1 → 2001-db8--1 (CoreDNS's endpoint/pod label)."""
    return ip.replace(".", "-").replace(":", "-")


def undash(label: str) -> str | None:
    """The IP a dashed label names, or None."""
    for cand in (label.replace("-", "."), label.replace("-", ":")):
        try:
            ip = ipaddress.ip_address(cand)
        except ValueError:
            continue
        if ip.version == 4 and cand.count(".") == 3 or ip.version == 6:
            return str(ip)
    return None


def reverse_ip(name: str) -> str | None:
    """The IP of a reverse name (`4.3.2.1.in-addr.arpa`, 32 nibbles `.ip6.arpa`), or None."""
    if name.endswith(".in-addr.arpa"):
        parts = name[: -len(".in-addr.arpa")].split(".")
        if len(parts) != 4:
            return None
        try:
            return str(ipaddress.IPv4Address(".".join(reversed(parts))))
        except ValueError:
            return None
    if name.endswith(".ip6.arpa"):
        nibbles = name[: -len(".ip6.arpa")].split(".")
        if len(nibbles) != 32 or any(len(n) != 1 for n in nibbles):
            return None
        try:
            return str(ipaddress.IPv6Address(int("".join(reversed(nibbles)), 16)))
        except ValueError:
            return None
    return None


def _family(ip: str) -> int:
    return 6 if ":" in ip else 4


def _strs(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    """A stored object's field that should be a mapping; {} when it is not (no object
    may stop the DNS: a malformed one just has no records)."""
    return v if isinstance(v, dict) else {}


def service_view(svc: dict[str, Any], slices: list[dict[str, Any]]) -> _Service:
    """The records-relevant view of one Service and its EndpointSlices."""
    md = _dict(svc.get("metadata"))
    spec = _dict(svc.get("spec"))
    ips = [ip for ip in _strs(spec.get("clusterIPs")) if isinstance(ip, str)]
    if not ips and isinstance(spec.get("clusterIP"), str) and spec.get("clusterIP"):
        ips = [spec["clusterIP"]]
    headless = ips[:1] == ["None"]
    valid = []
    for ip in ips:
        try:
            valid.append(str(ipaddress.ip_address(ip)))
        except ValueError:  # "None" (headless) and garbage
            continue
    ports = tuple((str(p["name"]).lower(), str(p.get("protocol") or "TCP").lower(), p["port"])
                  for p in _strs(spec.get("ports"))
                  if isinstance(p, dict) and p.get("name") and type(p.get("port")) is int)
    endpoints: dict[tuple[str, str], _Endpoint] = {}
    if headless:
        for sl in sorted(slices, key=lambda s: str(_dict(s.get("metadata")).get("name"))):
            if sl.get("addressType") not in ("IPv4", "IPv6"):
                continue
            sports = tuple((str(p.get("name") or "").lower(), str(p.get("protocol") or "TCP").lower(),
                            p["port"]) for p in _strs(sl.get("ports"))
                           if isinstance(p, dict) and type(p.get("port")) is int)
            for ep in _strs(sl.get("endpoints")):
                if not isinstance(ep, dict):
                    continue
                # EndpointConditions: a nil `ready` means ready (discovery/v1).
                if _dict(ep.get("conditions")).get("ready") is False:
                    continue
                for addr in _strs(ep.get("addresses")):
                    if not isinstance(addr, str):
                        continue
                    try:
                        ip = str(ipaddress.ip_address(addr))
                    except ValueError:
                        continue
                    host = ep.get("hostname") if isinstance(ep.get("hostname"), str) else ""
                    host = (host or dashed(ip)).lower()
                    endpoints.setdefault((host, ip), _Endpoint(host, ip, sports))
    return _Service(namespace=str(md.get("namespace") or ""), name=str(md.get("name") or ""),
                    headless=headless, cluster_ips=tuple(valid),
                    external_name=str(spec.get("externalName") or "").rstrip(".").lower()
                    if spec.get("type") == "ExternalName" else "",
                    ports=ports, endpoints=tuple(endpoints.values()))


class ClusterRecords:
    """The record engine: fed objects (set_*/delete_*), asked `answer(qname, qtype)`."""

    def __init__(self, zone: str = "cluster.local", ttl: int = DEFAULT_TTL,
                 pod_mode: str = "insecure") -> None:
        if pod_mode not in POD_MODES:
            raise ValueError(f"pod records mode must be one of {', '.join(POD_MODES)}")
        self.zone = zone.strip(".").lower()
        self.ttl = ttl
        self.pod_mode = pod_mode
        self.generation = 0
        self._suffix = "." + self.zone
        self._services: dict[tuple[str, str], dict[str, Any]] = {}
        self._slices: dict[tuple[str, str], dict[str, Any]] = {}  # (ns, slice) → slice
        self._slices_of: dict[tuple[str, str], set[str]] = defaultdict(set)  # (ns, svc) → slices
        self._views: dict[tuple[str, str], _Service] = {}
        self._ptr: dict[str, dict[str, None]] = defaultdict(dict)  # ip → ordered names
        self._namespaces: set[str] = set()
        self._svc_count: dict[str, int] = defaultdict(int)
        self._pod_ips: dict[tuple[str, str], int] = defaultdict(int)  # (ns, ip) → pods
        self._pods: dict[tuple[str, str], tuple[str, ...]] = {}
        self._soa = RR(self.zone + ".", "SOA", ttl,
                       (f"ns.dns.{self.zone}.", f"hostmaster.{self.zone}.", 1, 7200, 1800, 86400, ttl))

    # -- feeding -----------------------------------------------------------------------
    def _changed(self) -> None:
        self.generation += 1

    def set_namespace(self, name: str) -> None:
        if name not in self._namespaces:
            self._namespaces.add(name)
            self._changed()

    def delete_namespace(self, name: str) -> None:
        if name in self._namespaces:
            self._namespaces.discard(name)
            self._changed()

    def set_service(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if key not in self._services:
            self._svc_count[key[0]] += 1
        self._services[key] = obj
        self._rebuild(key)

    def delete_service(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        if self._services.pop(key, None) is not None:
            self._svc_count[namespace] -= 1
            if self._svc_count[namespace] <= 0:
                del self._svc_count[namespace]
        self._rebuild(key)

    def set_slice(self, obj: dict[str, Any]) -> None:
        ns, name = _key(obj)
        old = self._slices.get((ns, name))
        self._slices[(ns, name)] = obj
        services = {_owner_service(obj)}
        if old is not None and _owner_service(old) != _owner_service(obj):
            services.add(_owner_service(old))
            self._slices_of[(ns, _owner_service(old))].discard(name)
        self._slices_of[(ns, _owner_service(obj))].add(name)
        for svc in services:
            self._rebuild((ns, svc))

    def delete_slice(self, namespace: str, name: str) -> None:
        old = self._slices.pop((namespace, name), None)
        if old is None:
            return
        svc = _owner_service(old)
        self._slices_of[(namespace, svc)].discard(name)
        if not self._slices_of[(namespace, svc)]:
            del self._slices_of[(namespace, svc)]
        self._rebuild((namespace, svc))

    def set_pod(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        status = _dict(obj.get("status"))
        ips = tuple(str(p.get("ip")) for p in _strs(status.get("podIPs"))
                    if isinstance(p, dict) and p.get("ip"))
        if not ips and status.get("podIP"):
            ips = (str(status["podIP"]),)
        if self._pods.get(key) == ips:
            return
        self.delete_pod(*key)
        self._pods[key] = ips
        for ip in ips:
            self._pod_ips[(key[0], ip)] += 1
        self._changed()

    def delete_pod(self, namespace: str, name: str) -> None:
        ips = self._pods.pop((namespace, name), None)
        if ips is None:
            return
        for ip in ips:
            self._pod_ips[(namespace, ip)] -= 1
            if self._pod_ips[(namespace, ip)] <= 0:
                del self._pod_ips[(namespace, ip)]
        self._changed()

    def _rebuild(self, key: tuple[str, str]) -> None:
        """Recompute one Service's view; `generation` moves only if its records did (a
        slice update that changes no record — a zone, a nodeName — keeps the caches)."""
        svc = self._services.get(key)
        view = None
        if svc is not None:
            slices = [self._slices[(key[0], n)] for n in self._slices_of.get(key, ())
                      if (key[0], n) in self._slices]
            view = service_view(svc, slices)
        old = self._views.get(key)
        if old == view:
            return
        if old is not None:
            del self._views[key]
            for ip, fqdn in self._ptr_names(old):
                self._ptr[ip].pop(fqdn, None)
                if not self._ptr[ip]:
                    del self._ptr[ip]
        if view is not None:
            self._views[key] = view
            for ip, fqdn in self._ptr_names(view):
                self._ptr[ip][fqdn] = None
        self._changed()

    def _ptr_names(self, view: _Service) -> list[tuple[str, str]]:
        base = f"{view.name}.{view.namespace}.svc.{self.zone}.".lower()
        if view.headless:
            return [(e.ip, f"{e.hostname}.{base}") for e in view.endpoints]
        return [(ip, base) for ip in view.cluster_ips]

    # -- answering -----------------------------------------------------------------------
    def in_zone(self, qname: str) -> bool:
        n = qname.rstrip(".").lower()
        return n == self.zone or n.endswith(self._suffix)

    def answer(self, qname: str, qtype: str) -> Answer:
        """What the cluster DNS answers for (qname, qtype); `forward` for other names."""
        name = qname if qname.endswith(".") else qname + "."
        n = name[:-1].lower()
        qtype = qtype.upper()
        if n == self.zone:
            return self._apex(name, qtype)
        if not n.endswith(self._suffix):
            ip = reverse_ip(n)
            if ip is not None and ip in self._ptr:
                if qtype != "PTR":
                    return Answer(authority=[])  # NODATA, no SOA of a zone we do not own
                return Answer(answer=[RR(name, "PTR", self.ttl, (t,)) for t in self._ptr[ip]])
            return Answer(forward=True)
        labels = n[: -len(self._suffix)].split(".")
        top = labels[-1]
        if top == "svc":
            return self._svc(name, qtype, labels[:-1])
        if top == "pod":
            return self._pod(name, qtype, labels[:-1])
        if labels == ["dns-version"]:
            if qtype == "TXT":
                return Answer(answer=[RR(name, "TXT", self.ttl, (SCHEMA_VERSION,))])
            return self._nodata()
        if labels == ["ns", "dns"]:
            dns = self._views.get(("kube-system", "kube-dns"))
            ips = dns.cluster_ips if dns is not None else ()
            return self._addresses(name, qtype, ips) if ips else self._nodata()
        if labels == ["dns"]:
            return self._nodata()
        return self._nxdomain()

    def _apex(self, name: str, qtype: str) -> Answer:
        if qtype == "SOA":
            return Answer(answer=[RR(name, "SOA", self.ttl, self._soa.data)])
        if qtype == "NS":
            return Answer(answer=[RR(name, "NS", self.ttl, (f"ns.dns.{self.zone}.",))])
        return self._nodata()

    def _nodata(self) -> Answer:
        return Answer(authority=[self._soa])

    def _nxdomain(self) -> Answer:
        return Answer(rcode=NXDOMAIN, authority=[self._soa])

    def _ns_exists(self, ns: str) -> bool:
        return ns in self._namespaces or ns in self._svc_count

    def _addresses(self, name: str, qtype: str, ips: tuple[str, ...] | list[str]) -> Answer:
        fam = 4 if qtype == "A" else 6 if qtype == "AAAA" else 0
        rrs = [RR(name, qtype, self.ttl, (ip,)) for ip in ips if _family(ip) == fam]
        return Answer(answer=rrs) if rrs else self._nodata()

    def _svc(self, name: str, qtype: str, labels: list[str]) -> Answer:
        if not labels:
            return self._nodata()  # svc.<zone>: an empty non-terminal
        if len(labels) == 1:
            return self._nodata() if self._ns_exists(labels[0]) else self._nxdomain()
        view = self._views.get((labels[-1], labels[-2]))
        if view is None:
            return self._nxdomain()
        if len(labels) == 2:
            return self._service(name, qtype, view)
        if len(labels) == 3:
            sub = labels[0]
            if sub.startswith("_"):  # _tcp.<svc>...: exists when some port uses it
                protos = {p[1] for p in view.ports} | {p[1] for e in view.endpoints for p in e.ports}
                return self._nodata() if sub[1:] in protos else self._nxdomain()
            if not view.headless:
                return self._nxdomain()
            ips = [e.ip for e in view.endpoints if e.hostname == sub]
            if not ips:
                return self._nxdomain()
            return self._addresses(name, qtype, ips)
        if len(labels) == 4 and labels[0].startswith("_") and labels[1].startswith("_"):
            return self._srv(name, qtype, view, labels[0][1:], labels[1][1:])
        return self._nxdomain()

    def _service(self, name: str, qtype: str, view: _Service) -> Answer:
        if view.external_name:
            target = view.external_name + "."
            ans = Answer(answer=[RR(name, "CNAME", self.ttl, (target,))])
            if qtype != "CNAME":
                if self.in_zone(target):
                    inner = self.answer(target, qtype)
                    ans.answer += inner.answer
                else:
                    ans.chase = target
            return ans
        if view.headless:
            if not view.endpoints:
                return self._nxdomain()
            if qtype == "SRV":
                return self._srv(name, qtype, view, None, None)
            return self._addresses(name, qtype, [e.ip for e in view.endpoints])
        if qtype == "SRV":
            return self._srv(name, qtype, view, None, None)
        return self._addresses(name, qtype, view.cluster_ips)

    def _srv(self, name: str, qtype: str, view: _Service, port: str | None,
             proto: str | None) -> Answer:
        """SRV records of named ports; `port`/`proto` None: every named port (the
        Service name asked for SRV, as CoreDNS answers it)."""
        def match(p: tuple[str, str, int]) -> bool:
            return bool(p[0]) and (port is None or (p[0] == port and p[1] == proto))

        base = f"{view.name}.{view.namespace}.svc.{self.zone}.".lower()
        records: list[tuple[int, str]] = []
        extra: list[RR] = []
        if view.headless:
            for e in view.endpoints:
                target = f"{e.hostname}.{base}"
                hit = [p[2] for p in e.ports if match(p)]
                records += [(num, target) for num in hit]
                if hit:
                    extra.append(RR(target, "A" if _family(e.ip) == 4 else "AAAA", self.ttl, (e.ip,)))
        elif view.cluster_ips:
            records = [(p[2], base) for p in view.ports if match(p)]
            extra = [RR(base, "A" if _family(ip) == 4 else "AAAA", self.ttl, (ip,))
                     for ip in view.cluster_ips] if records else []
        if not records:
            return self._nxdomain() if port is not None else self._nodata()
        if qtype != "SRV":
            return self._nodata()
        weight = max(1, 100 // len(records))
        return Answer(answer=[RR(name, "SRV", self.ttl, (0, weight, num, target))
                              for num, target in records], additional=extra)

    def _pod(self, name: str, qtype: str, labels: list[str]) -> Answer:
        if self.pod_mode == "disabled":
            return self._nxdomain()
        if not labels:
            return self._nodata()
        if len(labels) == 1:
            return self._nodata() if self._ns_exists(labels[0]) else self._nxdomain()
        if len(labels) != 2:
            return self._nxdomain()
        ip = undash(labels[0])
        if ip is None:
            return self._nxdomain()
        if self.pod_mode == "verified" and (labels[1], ip) not in self._pod_ips:
            return self._nxdomain()
        return self._addresses(name, qtype, [ip])


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    md = _dict(obj.get("metadata"))
    return str(md.get("namespace") or ""), str(md.get("name") or "")


def _owner_service(sl: dict[str, Any]) -> str:
    return str(_dict(_dict(sl.get("metadata")).get("labels")).get(SERVICE_NAME_LABEL) or "")


__all__ = ["DEFAULT_TTL", "NOERROR", "NXDOMAIN", "POD_MODES", "RR", "SCHEMA_VERSION", "Answer",
           "ClusterRecords", "dashed", "reverse_ip", "service_view", "undash"]
