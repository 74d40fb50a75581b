"""The pod worker's last steps: stop every container, tear the pod down, finalize it.

Split from `fleet.agent.worker`: `PodTeardown` is a mixin of `PodWorker` (it uses the
worker's containers, kill and event helpers), holding the `[terminating]` and `[torn
down]` steps of the worker's state diagram and the final DELETE that finishes the
API's graceful deletion — only once the inventory (`fleet.agent.inventory`) shows
nothing of the pod left on the machine.
"""

from __future__ import annotations

import logging
import shutil
from typing import TYPE_CHECKING, Any

import httpx
import trio

from fleet.agent import inventory
from fleet.client import ApiException
from fleet.runtime.driver import ContainerStatus, RuntimeDriverError

if TYPE_CHECKING:
    from fleet.agent.worker import ContainerRun

log = logging.getLogger("fleet.agent.worker")


class PodTeardown:
    """The termination steps of `fleet.agent.worker.PodWorker`."""

    # Provided by PodWorker.
    env: Any
    pod: dict[str, Any]
    uid: str
    namespace: str
    name: str

    async def _stop_all(self) -> None:
        grace = self._grace
        async with trio.open_nursery() as n:
            for c in self.containers():
                if c.handle is not None:
                    n.start_soon(self._stop_one, c, grace)

    async def _stop_one(self, c: ContainerRun, grace: float) -> None:
        assert c.handle is not None
        try:
            st = await self.env.driver.inspect(c.handle)
        except RuntimeDriverError:
            return
        if st.status == ContainerStatus.EXITED:
            if "terminated" not in c.view.state and st.exit is not None:
                self._record_exit(c, st.exit)
            return
        await self._event("Normal", "Killing", f"Stopping container {c.name}", c)
        try:
            exit_ = await self._kill(c, c.handle, grace)
        except RuntimeDriverError as e:
            log.warning("pod %s/%s: stopping %s: %s", self.namespace, self.name, c.name, e)
            return
        self._record_exit(c, exit_)

    async def _teardown(self) -> None:
        """Remove everything the pod had on this node, and make sure it is gone.

        Each attempt goes through the runtime driver and the network driver (shielded,
        so an attempt always completes), then asks the inventory what of the pod is
        still on the machine and force-removes that (`inventory.remove_pod`: kill,
        `runc delete --force`, unmount, rmdir).  Every error is logged and counted in
        `fleet_agent_cleanup_failures_total`; an attempt that leaves something behind
        gets a Warning `FailedKillPod` Event on the pod and is retried with back-off
        (1 s doubling to 60 s) for as long as it takes, as the kubelet does: the pod
        object is finalized only once its containers, netns and veth are really gone,
        so a leak stays visible as a pod stuck in Terminating, with its Events and the
        agent's log saying why (`kubectl delete --force` is the way out, as for a
        kubelet)."""
        backoff = 1.0
        while True:
            with trio.CancelScope(shield=True):
                errors = await self._teardown_once()
                left = await self._leftovers()
                if left:
                    report = await trio.to_thread.run_sync(lambda: inventory.remove_pod(
                        self.env.data_dir, self.uid, netns_dir=self.env.netns_dir,
                        with_veth=self._has_veth))
                    errors += report.errors
                    left = await self._leftovers()
            if errors or left:
                what = "; ".join([*errors, *(f"{x} still there" for x in left)])
                log.warning("pod %s/%s: teardown: %s", self.namespace, self.name, what)
                await self._event("Warning", "FailedKillPod",
                                  f"error tearing the pod down: {what}"
                                  + (f"; retrying in {backoff:.0f}s" if left else ""))
            if not left:
                return
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)

    @property
    def _has_veth(self) -> bool:
        return (self.netns_path is not None and self.env.network is not None
                and getattr(self.env.network, "name", "") == "bridge")

    async def _leftovers(self) -> list[str]:
        return await trio.to_thread.run_sync(lambda: inventory.pod_leftovers(
            self.env.data_dir, self.uid, netns_dir=self.env.netns_dir,
            with_veth=self._has_veth))

    async def _teardown_once(self) -> list[str]:
        """One pass through the drivers; the errors it met (each logged and counted)."""
        errors: list[str] = []

        def failed(resource: str, what: str, e: BaseException) -> None:
            inventory.failed("teardown", resource)
            errors.append(f"{what}: {e}")

        for h in self._stray:
            try:
                await self.env.driver.remove(h)
            except (RuntimeDriverError, OSError) as e:
                failed("container", f"removing container {h.id}", e)
        for c in self.containers():
            for h in [*c.old_handles, c.previous, c.handle]:
                if h is not None:
                    try:
                        await self.env.driver.remove(h)
                    except (RuntimeDriverError, OSError) as e:
                        failed("container", f"removing container {c.name} ({h.id})", e)
        if self.sandbox is not None:
            try:
                await self.env.driver.remove_sandbox(self.sandbox)
            except (RuntimeDriverError, OSError) as e:
                failed("sandbox", "removing the sandbox", e)
        if getattr(self.env, "tokens", None) is not None:
            self.env.tokens.forget(self.uid)  # its bound tokens are dead with it
        if self._vm is not None:
            try:
                await self._vm.teardown()
            except Exception as e:  # noqa: BLE001 - reported, and the mounts are re-checked
                failed("mount", "volume teardown", e)
        elif getattr(self.env, "csi", None) is not None:
            # Set-up never got as far as the volumes in this run (an agent restarted
            # and the pod deleted at once): what an earlier run published is recorded.
            try:
                await self.env.csi.unpublish_pod(self.uid, self.pod_dir)
            except Exception as e:  # noqa: BLE001 - reported, and the mounts are re-checked
                failed("mount", "volume teardown", e)
        if self.netns_path is not None and self.env.network is not None:
            from fleet.network import PodRef, delete_pod_netns
            try:
                await self.env.network.teardown(PodRef.from_pod(self.pod), self.netns_path)
            except Exception as e:  # noqa: BLE001 - any driver's failure; the veth is re-checked
                failed("veth", "network teardown", e)
            try:
                await delete_pod_netns(self.netns_path)
            except OSError as e:
                failed("netns", "deleting the netns", e)

        def rm_pod_dir() -> None:
            from fleet.agent.volumes import mounts_under

            if not self.pod_dir.exists():
                return
            left = mounts_under(self.pod_dir)
            if left:
                # Never delete through a mount point: a claimed volume's data is there.
                raise OSError(f"not removing {self.pod_dir}: still mounted: "
                              f"{', '.join(map(str, left))}")
            shutil.rmtree(self.pod_dir)

        try:
            await trio.to_thread.run_sync(rm_pod_dir)
        except OSError as e:
            failed("state", "removing the pod directory", e)
        return errors

    async def _delete_object(self) -> None:
        """Finish the API's graceful deletion: remove the object for good."""
        backoff = 0.5
        for _ in range(20):
            try:
                await self.env.client.delete(
                    "v1", "pods", self.name, self.namespace,
                    body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                          "preconditions": {"uid": self.uid}})
                return
            except ApiException as e:
                if e.code in (404, 409):
                    return  # gone already, or a new pod of the same name
                log.warning("pod %s/%s: final delete failed: %s", self.namespace, self.name, e)
            except (httpx.TransportError, OSError) as e:
                log.warning("pod %s/%s: final delete failed: %s", self.namespace, self.name, e)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)


__all__ = ["PodTeardown"]
