"""The pod worker's sandbox steps: network namespace, network, /etc files, volumes.

Split from `fleet.agent.worker`: `PodSandbox` is a mixin of `PodWorker` (it uses
the worker's pod, env, containers and status), holding the `[sandbox]` step of the
worker's state diagram — netns + network setup (unless hostNetwork or no pod
network), the runtime sandbox (pod cgroup parent), /etc/hosts and resolv.conf,
volumes and their periodic refresh — retried with back-off until it succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.agent.dnsconfig import (
    NodeDNS,
    ResolvConf,
    container_hostname,
    hosts_file,
    parse_resolv_conf,
    pod_dns,
)
from fleet.client import ApiException
from fleet.runtime.driver import Device, Mount, RuntimeDriverError, SandboxSpec

log = logging.getLogger("fleet.agent.worker")

VOLUME_REFRESH_PERIOD = 10.0


class SetupError(Exception):
    """The pod's sandbox could not be built (network, volumes); retried."""


class PodSandbox:
    """The sandbox and volume steps of `fleet.agent.worker.PodWorker`."""

    # Provided by PodWorker.
    env: Any
    pod: dict[str, Any]
    pod_ips: list[str]
    uid: str
    namespace: str
    name: str

    @property
    def pod_dir(self) -> Path:
        return self.env.data_dir / "pods" / self.uid

    async def _setup_with_retry(self) -> None:
        backoff = 1.0
        while True:
            try:
                await self._setup()
                self._message = ""
                return
            except (SetupError, RuntimeDriverError, OSError, ApiException, httpx.TransportError) as e:
                # API errors reading the pod's Secrets and ConfigMaps are retried too: a
                # server restarting, or a 403 from the Node authorizer in the moment
                # before its graph has seen the pod bound here (as a kubelet retries
                # MountVolume.SetUp).
                log.warning("pod %s/%s: sandbox setup failed: %s", self.namespace, self.name, e)
                self._message = f"sandbox setup failed: {e}"
                for c in self.containers():
                    c.view.state = {"waiting": {"reason": "ContainerCreating",
                                                "message": str(e)}}
                self._changed()
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)

    async def _setup(self) -> None:
        netns: str | None = None
        if self.host_network:
            self.pod_ips = [self.env.host_ip]
        else:
            from fleet.network import PodRef, create_pod_netns
            # The pod directory first: it is what marks the netns as this agent's
            # (fleet.agent.inventory), so a crash right after creating it leaves
            # nothing the start-time garbage collection cannot attribute.
            await trio.to_thread.run_sync(
                lambda: self.pod_dir.mkdir(parents=True, exist_ok=True))
            args = (self.uid,) if self.env.netns_dir is None else (self.uid, self.env.netns_dir)
            netns = await create_pod_netns(*args)
            self.netns_path = netns
            try:
                net = await self.env.network.setup(PodRef.from_pod(self.pod), netns)
            except Exception as e:
                raise SetupError(f"network: {e}") from e
            self.pod_ips = list(net.ips) or [self.env.host_ip]
            if self.env.netns_ready is not None:
                # NetworkPolicy (in strict mode: deny-all first) before any container runs.
                try:
                    await self.env.netns_ready(self.pod, netns)
                except Exception as e:
                    raise SetupError(f"network policy: {e}") from e
        node_dns = self.env.dns or NodeDNS()
        hostname = container_hostname(self.pod, node_dns.cluster_domain)
        files, dns_events = await trio.to_thread.run_sync(self._write_etc_files, node_dns)
        for etype, reason, message in dns_events:
            await self._event(etype, reason, message)
        sspec = SandboxSpec(pod_uid=self.uid, namespace=self.namespace, name=self.name,
                            log_dir=self.log_dir, hostname=hostname,
                            netns_path=Path(netns) if netns else None,
                            # The host's /etc/hosts for host-network pods (as the
                            # kubelet); their own resolv.conf always (ClusterFirstWithHostNet).
                            hosts_file=files[0] if netns else None,
                            dns_file=files[1])
        self.sandbox = await self.env.driver.create_sandbox(sspec)
        await self._setup_volumes()
        self._changed()

    @property
    def log_dir(self) -> Path:
        return self.env.data_dir / "logs" / f"{self.namespace}_{self.name}_{self.uid}"

    def _write_etc_files(self, node_dns: NodeDNS) -> tuple[tuple[Path, Path | None],
                                                            list[tuple[str, str, str]]]:
        """/etc/hosts and resolv.conf by the kubelet's rules (fleet.agent.dnsconfig)."""
        d = self.pod_dir / "etc"
        d.mkdir(parents=True, exist_ok=True)
        hosts = d / "hosts"
        hosts.write_text(hosts_file(self.pod, self.pod_ips or ["127.0.0.1"], node_dns.cluster_domain))
        host_conf = ResolvConf()
        if node_dns.resolv_conf:
            try:
                host_conf = parse_resolv_conf(Path(node_dns.resolv_conf).read_text())
            except OSError as e:
                log.warning("pod %s/%s: reading %s: %s", self.namespace, self.name,
                            node_dns.resolv_conf, e)
        decision = pod_dns(self.pod, node_dns, host_conf)
        resolv = d / "resolv.conf"
        resolv.write_text(decision.conf.render())
        return (hosts, resolv), decision.events

    # -- volumes ---------------------------------------------------------------------------
    async def _setup_volumes(self) -> None:
        if self.env.volumes is not None:
            # fleet.agent.volumes: every volume type, configMap/secret kept up to date.
            if self._vm is None:
                # Claimed volumes go through the node's CSI volume manager, if any.
                extra: dict[str, Any] = ({"csi": self.env.csi}
                                         if getattr(self.env, "csi", None) is not None else {})
                if getattr(self.env, "tokens", None) is not None:
                    # Bound ServiceAccount tokens for serviceAccountToken projections.
                    extra["token_source"] = self.env.tokens
                self._vm = self.env.volumes.VolumeManager(self.pod_dir, self._lookup,
                                                          await self._allocatable(), **extra)
            try:
                self._volume_paths = await self._vm.setup(self.pod)
            except self.env.volumes.VolumeError as e:
                message = e.message if hasattr(e, "message") else str(e)
                await self._event("Warning", getattr(e, "reason", None) or "FailedMount",
                                  message)
                raise SetupError(message) from e
            return
        if (self.pod.get("spec") or {}).get("volumes"):
            self._volume_paths = await trio.to_thread.run_sync(self._builtin_volumes)

    def _builtin_volumes(self) -> dict[str, Path]:
        """emptyDir and hostPath, for when the volumes module is not there."""
        out: dict[str, Path] = {}
        for v in (self.pod.get("spec") or {}).get("volumes") or []:
            if "emptyDir" in v:
                p = self.pod_dir / "volumes" / v["name"]
                p.mkdir(parents=True, exist_ok=True)
                p.chmod(0o777)
                out[v["name"]] = p
            elif "hostPath" in v:
                p = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") in ("DirectoryOrCreate",):
                    p.mkdir(parents=True, exist_ok=True)
                out[v["name"]] = p
            else:
                raise SetupError(f"volume {v['name']!r}: this agent supports only "
                                 "emptyDir and hostPath volumes")
        return out

    async def _refresh_volumes(self) -> None:
        """Keep configMap/secret/downwardAPI volumes in step with their objects."""
        if self._vm is None:
            return
        while True:
            await trio.sleep(VOLUME_REFRESH_PERIOD)
            try:
                changed = await self._vm.refresh(self.pod)
            except Exception as e:  # an object deleted meanwhile: old content stays
                log.info("pod %s/%s: volume refresh: %s", self.namespace, self.name, e)
                continue
            if changed:
                log.info("pod %s/%s: updated volumes %s", self.namespace, self.name, changed)

    def _devices(self, container: Mapping[str, Any]) -> list[Device]:
        """The container's volumeDevices (raw block volumes)."""
        devices_for = getattr(self._vm, "devices_for", None)
        if devices_for is None:
            return []
        return list(devices_for(container))

    def _mounts(self, container: Mapping[str, Any], env: Mapping[str, str]) -> list[Mount]:
        if self._vm is not None:
            return list(self._vm.mounts_for(container, env=env))
        paths = self._volume_paths
        out = []
        for vm in container.get("volumeMounts") or []:
            host = paths.get(vm["name"])
            if host is None:
                continue
            host = Path(host)
            if vm.get("subPath"):
                host = host / vm["subPath"]
            prop = {"HostToContainer": "host-to-container",
                    "Bidirectional": "bidirectional"}.get(vm.get("mountPropagation", ""), "private")
            out.append(Mount(host_path=host, container_path=vm["mountPath"],
                             read_only=bool(vm.get("readOnly")), propagation=prop))  # type: ignore[arg-type]
        return out


__all__ = ["VOLUME_REFRESH_PERIOD", "PodSandbox", "SetupError"]
