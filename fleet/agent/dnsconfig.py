"""A pod's resolv.conf, /etc/hosts and hostname: the kubelet's rules, as pure functions.

Transcribed in our words from the kubelet (pkg/kubelet/network/dns and the hosts-file
writer of kubelet_pods.go):

* **dnsPolicy** → where the pod's resolver settings come from:
  - `ClusterFirst` (the default): `nameserver <cluster DNS>`, `search <ns>.svc.<domain>
    svc.<domain> <domain>` followed by the node's own search domains, `options ndots:5`.
    A `hostNetwork` pod with ClusterFirst gets `Default` instead; a node without
    cluster DNS (no `--cluster-dns`, or no pod networking to reach it) falls back to
    `Default` with a `MissingClusterDNS` Warning Event.
  - `ClusterFirstWithHostNet`: ClusterFirst, for hostNetwork pods too.
  - `Default`: the node's resolv.conf (nameservers, search, options); with the node's
    resolv.conf set to "" (kubelet's `--resolv-conf=""`), `nameserver 127.0.0.1` and
    `search .`.
  - `None`: nothing but the pod's `dnsConfig`.
* **dnsConfig** is appended: nameservers and searches after the policy's (duplicates
  dropped), options merged by name (the pod's value wins).
* **Limits**: at most 3 nameservers, 32 search domains and 2048 characters of search
  line; past them the rest is dropped with a `DNSConfigForming` Warning Event.
* **Hostname**: `spec.hostname`, else the pod name cut to 63 characters (no trailing
  `-`/`.`); with `spec.subdomain` the pod's domain is `<subdomain>.<ns>.svc.<domain>`,
  and `setHostnameAsFQDN` makes the container's hostname the full name.
* **/etc/hosts**: localhost lines, then one line per pod IP —
  `<ip> <hostname>.<subdomain>.<ns>.svc.<domain> <hostname>` with a subdomain, else
  `<ip> <hostname>` — then the pod's `hostAliases`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_NAMESERVERS = 3
MAX_SEARCH_PATHS = 32
MAX_SEARCH_CHARS = 2048
DEFAULT_OPTIONS = ("ndots:5",)
CLUSTER_FIRST, CLUSTER_FIRST_HOSTNET, DEFAULT, NONE = (
    "ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")


@dataclass(frozen=True)
class NodeDNS:
    """The node's DNS settings (the agent's --cluster-dns, --cluster-domain, --resolv-conf)."""

    cluster_dns: tuple[str, ...] = ("10.43.0.10",)
    cluster_domain: str = "cluster.local"
    resolv_conf: str = "/etc/resolv.conf"


@dataclass
class ResolvConf:
    nameservers: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"nameserver {ns}" for ns in self.nameservers]
        if self.searches:
            lines.append("search " + " ".join(self.searches))
        if self.options:
            lines.append("options " + " ".join(self.options))
        return "".join(line + "\n" for line in lines)


@dataclass
class PodDNS:
    conf: ResolvConf
    # Events for the pod: (type, reason, message).
    events: list[tuple[str, str, str]] = field(default_factory=list)


def parse_resolv_conf(text: str) -> ResolvConf:
    """nameserver lines (all), the last search line, every options field (kubelet's parser)."""
    out = ResolvConf()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0]
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "nameserver" and len(fields) > 1:
            out.nameservers.append(fields[1])
        elif fields[0] == "search":
            # The last search line wins; "x." and "x" are one domain.
            out.searches = _unique(s.rstrip(".") or "." for s in fields[1:])
        elif fields[0] == "options":
            out.options.extend(fields[1:])
    return out


def _unique(items: Any) -> list[str]:
    seen: dict[str, None] = {}
    for i in items:
        seen.setdefault(i, None)
    return list(seen)


def merge_options(existing: Sequence[str], pod_options: Any) -> list[str]:
    """kubelet's mergeDNSOptions: by name, the pod's value wins (order kept)."""
    merged: dict[str, str] = {}
    for op in existing:
        name, _, value = op.partition(":")
        merged[name] = value
    for op in pod_options or []:
        if not isinstance(op, dict) or not op.get("name"):
            continue
        merged[str(op["name"])] = "" if op.get("value") is None else str(op["value"])
    return [f"{k}:{v}" if v else k for k, v in merged.items()]


def dns_type(pod: dict[str, Any], node: NodeDNS) -> str:
    """The effective policy: ClusterFirst, Default or None (kubelet's getPodDNSType)."""
    spec = pod.get("spec") or {}
    policy = spec.get("dnsPolicy") or CLUSTER_FIRST
    if policy == NONE:
        return NONE
    if policy == CLUSTER_FIRST_HOSTNET:
        return CLUSTER_FIRST
    if policy == CLUSTER_FIRST and not spec.get("hostNetwork"):
        return CLUSTER_FIRST
    return DEFAULT


def pod_dns(pod: dict[str, Any], node: NodeDNS, host: ResolvConf) -> PodDNS:
    """The pod's resolv.conf from its spec, the node's settings and the node's resolv.conf."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    events: list[tuple[str, str, str]] = []
    kind = dns_type(pod, node)
    conf = ResolvConf(list(host.nameservers), list(host.searches), list(host.options))
    if kind == CLUSTER_FIRST and not node.cluster_dns:
        events.append(("Warning", "MissingClusterDNS",
                       f"pod: \"{md.get('name')}_{md.get('namespace')}({md.get('uid', '')})\". "
                       "kubelet does not have ClusterDNS IP configured and cannot create Pod "
                       f"using \"{CLUSTER_FIRST}\" policy. Falling back to \"{DEFAULT}\" policy."))
        kind = DEFAULT
    if kind == CLUSTER_FIRST:
        conf.nameservers = list(node.cluster_dns)
        if node.cluster_domain:
            ns = md.get("namespace") or "default"
            d = node.cluster_domain
            conf.searches = _unique([f"{ns}.svc.{d}", f"svc.{d}", d, *host.searches])
        conf.options = list(DEFAULT_OPTIONS)
    elif kind == DEFAULT:
        if not node.resolv_conf:
            conf = ResolvConf(["127.0.0.1"], ["."], [])
    else:
        conf = ResolvConf()
    dc = spec.get("dnsConfig")
    if isinstance(dc, dict):
        conf.nameservers = _unique([*conf.nameservers,
                                    *(str(s) for s in dc.get("nameservers") or [])])
        conf.searches = _unique([*conf.searches, *(str(s) for s in dc.get("searches") or [])])
        conf.options = merge_options(conf.options, dc.get("options"))
    return PodDNS(*_fit_limits(conf, events))


def _fit_limits(conf: ResolvConf, events: list[tuple[str, str, str]]
                ) -> tuple[ResolvConf, list[tuple[str, str, str]]]:
    if len(conf.nameservers) > MAX_NAMESERVERS:
        conf.nameservers = conf.nameservers[:MAX_NAMESERVERS]
        events.append(("Warning", "DNSConfigForming",
                       "Nameserver limits were exceeded, some nameservers have been omitted, "
                       f"the applied nameserver line is: {' '.join(conf.nameservers)}"))
    searches = conf.searches
    trimmed = False
    if len(searches) > MAX_SEARCH_PATHS:
        searches, trimmed = searches[:MAX_SEARCH_PATHS], True
    while searches and len(" ".join(searches)) > MAX_SEARCH_CHARS:
        searches, trimmed = searches[:-1], True
    if trimmed:
        conf.searches = searches
        events.append(("Warning", "DNSConfigForming",
                       "Search Line limits were exceeded, some search paths have been omitted, "
                       f"the applied search line is: {' '.join(searches)}"))
    return conf, events


def pod_hostname(pod: dict[str, Any], cluster_domain: str) -> tuple[str, str]:
    """(hostname, domain) — domain "" without a subdomain (kubelet's GeneratePodHostNameAndDomain)."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    hostname = str(spec.get("hostname") or "")
    if not hostname:
        hostname = str(md.get("name") or "")
        if len(hostname) > 63:
            hostname = hostname[:63].rstrip("-.")
    domain = ""
    if spec.get("subdomain"):
        domain = f"{spec['subdomain']}.{md.get('namespace') or 'default'}.svc.{cluster_domain}"
    return hostname, domain


def container_hostname(pod: dict[str, Any], cluster_domain: str) -> str:
    """The UTS hostname: the FQDN with setHostnameAsFQDN and a domain, else the short name."""
    hostname, domain = pod_hostname(pod, cluster_domain)
    if (pod.get("spec") or {}).get("setHostnameAsFQDN") and domain:
        return f"{hostname}.{domain}"[:64]
    return hostname


def hosts_file(pod: dict[str, Any], pod_ips: Sequence[str], cluster_domain: str) -> str:
    """The pod's /etc/hosts (kubelet's managedHostsFileContent)."""
    hostname, domain = pod_hostname(pod, cluster_domain)
    lines = ["# Kubernetes-managed hosts file.",
             "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback",
             "fe00::0\tip6-localnet",
             "fe00::0\tip6-mcastprefix",
             "fe00::1\tip6-allnodes",
             "fe00::2\tip6-allrouters"]
    for ip in pod_ips:
        lines.append(f"{ip}\t{hostname}.{domain}\t{hostname}" if domain else f"{ip}\t{hostname}")
    aliases = (pod.get("spec") or {}).get("hostAliases") or []
    if aliases:
        lines.append("")
        lines.append("# Entries added by HostAliases.")
        for a in aliases:
            if isinstance(a, dict) and a.get("ip") and a.get("hostnames"):
                lines.append(f"{a['ip']}\t" + "\t".join(str(h) for h in a["hostnames"]))
    return "\n".join(lines) + "\n"


__all__ = ["MAX_NAMESERVERS", "MAX_SEARCH_CHARS", "MAX_SEARCH_PATHS", "NodeDNS", "PodDNS",
           "ResolvConf", "container_hostname", "dns_type", "hosts_file", "merge_options",
           "parse_resolv_conf", "pod_dns", "pod_hostname"]
