"""The agent API's POST /signal/{ns}/{pod}/{container}?signal=: the runtime driver's
`signal` with the parsed number, and the refusals (unknown signal, container not
running, unknown pod or container)."""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.agent.api import LocatedContainer, LocateError, create_app
from fleet.runtime.driver import ContainerHandle, ContainerState, ContainerStatus

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = datetime(2026, 1, 1, tzinfo=UTC)
HANDLE = ContainerHandle("cid", "web", "sb", 4242, 4241, NOW, Path("/nonexistent"), Path("/nonexistent/log"))


class Driver:
    def __init__(self, status: ContainerStatus = ContainerStatus.RUNNING) -> None:
        self.sent: list[tuple[str, int]] = []
        self.status = status

    async def inspect(self, handle: ContainerHandle) -> ContainerState:
        return ContainerState(self.status, handle.pid, NOW)

    async def signal(self, handle: ContainerHandle, sig: int) -> None:
        self.sent.append((handle.id, sig))


class Locator:
    def __init__(self, driver: Driver, handle: ContainerHandle | None = HANDLE) -> None:
        self.driver, self.handle = driver, handle

    def find(self, namespace: str, pod: str, container: str | None) -> LocatedContainer | None:
        if pod != "p":
            return None
        if container not in (None, "web"):
            raise LocateError.invalid_container(str(container), pod)
        return LocatedContainer(self.driver, self.handle, name="web")  # type: ignore[arg-type]

    def all(self) -> list[Any]:
        return []

    def pod_sandbox(self, namespace: str, pod: str) -> None:
        return None


async def post(locator: Locator, path: str) -> tuple[int, dict[str, Any]]:
    c = create_app(locator, token=TOKEN, node_name="n1").test_client()  # type: ignore[arg-type]
    resp = await c.post(path, headers=AUTH)
    return resp.status_code, await resp.get_json()


async def test_signal_reaches_the_driver() -> None:
    driver = Driver()
    status, body = await post(Locator(driver), "/signal/ns/p/web?signal=SIGHUP")
    assert status == 200 and body["status"] == "Success"
    assert driver.sent == [("cid", signal.SIGHUP)]


async def test_refusals() -> None:
    driver = Driver()
    status, body = await post(Locator(driver), "/signal/ns/p/web?signal=SIGNOPE")
    assert status == 400 and "unknown signal 'SIGNOPE'" in body["message"]
    status, body = await post(Locator(driver), "/signal/ns/gone/web?signal=SIGHUP")
    assert status == 404 and body["message"] == 'pods "gone" not found'
    status, body = await post(Locator(driver), "/signal/ns/p/db?signal=SIGHUP")
    assert status == 400 and body["message"] == "container db is not valid for pod p"
    status, body = await post(Locator(driver, handle=None), "/signal/ns/p/web?signal=SIGHUP")
    assert status == 400 and body["message"] == 'container "web" in pod "p" is not running'
    status, body = await post(Locator(Driver(ContainerStatus.EXITED)), "/signal/ns/p/web?signal=SIGHUP")
    assert status == 400 and "is not running" in body["message"]
    c = create_app(Locator(driver), token=TOKEN, node_name="n1").test_client()  # type: ignore[arg-type]
    assert (await c.post("/signal/ns/p/web?signal=SIGHUP")).status_code == 401
    assert driver.sent == []
