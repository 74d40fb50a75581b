"""`kfleet image import` / `kfleet image list` end to end.

Real pieces throughout: a `fleet server --no-agent` process, the agent's HTTP API
(`fleet.agent.api.serve` with `image_routes` over a real ImageStore) on a free
loopback port in a thread of this process, a Node object pointing at it (InternalIP
127.0.0.1 + daemonEndpoints.kubeletEndpoint.Port), and kfleet run in process.  The
archives are the busybox image built by fleet.testing.oci_image, written both as an
OCI image layout and as a `docker save` tarball.  The path each upload takes is
kfleet → API server `nodes/n1/proxy/images/import` → agent → ImageStore.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from fleet.agent.api import LocatedContainer, PodContainers, serve
from fleet.agent.images_api import image_routes
from fleet.cli.kfleet import run as kfleet
from fleet.runtime.images import ImageStore
from fleet.testing.oci_image import (
    build_busybox_image,
    busybox_problem,
    write_docker_archive,
    write_oci_archive,
)
from tests.conftest import FleetServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(busybox_problem() is not None, reason=str(busybox_problem())),
]

NODE = "n1"


class NoPods:
    """A ContainerLocator for an agent that runs nothing: only the image routes matter."""

    def find(self, namespace: str, pod: str, container: str | None) -> LocatedContainer | None:
        return None

    def all(self) -> list[PodContainers]:
        return []


class AgentThread:
    """The agent API served by its own Trio loop in a thread (kfleet runs trio.run itself)."""

    def __init__(self, store: ImageStore, token: str) -> None:
        self.store = store
        self.token = token
        self.port = 0
        self._ready = threading.Event()
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="agent-api", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._trio_token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                url = await nursery.start(partial(
                    serve, NoPods(), address="127.0.0.1", port=0, token=self.token,
                    node_name=NODE, extra_routes=image_routes(self.store)))
                self.port = int(url.rsplit(":", 1)[1])
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        try:
            trio.run(main)
        except BaseException as e:  # surfaced by start() instead of vanishing with the thread
            self._error = e
            self._ready.set()

    def start(self) -> AgentThread:
        self._thread.start()
        assert self._ready.wait(15), "the agent API did not start"
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._trio_token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._trio_token)
        self._thread.join(10)


def register_node(server: FleetServer, name: str, port: int) -> None:
    with server.client() as http:
        resp = http.post("/api/v1/nodes", json={"metadata": {"name": name, "annotations": {"fleet.dev/agent-api-scheme": "http"}}})
        assert resp.status_code == 201, resp.text
        status = {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}
        resp = http.patch(f"/api/v1/nodes/{name}/status", json={"status": status},
                          headers={"Content-Type": "application/merge-patch+json"})
        assert resp.status_code == 200, resp.text


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ImageStore:
    return ImageStore(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def agent(fleet_server: FleetServer, store: ImageStore) -> Iterator[AgentThread]:
    # The server presents its admin token to agents; a real agent is started with it.
    a = AgentThread(store, fleet_server.token).start()
    try:
        register_node(fleet_server, NODE, a.port)
        yield a
    finally:
        a.stop()


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    image = build_busybox_image()
    d = tmp_path_factory.mktemp("archives")
    return {
        "oci": write_oci_archive(image, d / "busybox-oci.tar", "docker.io/library/busybox:oci"),
        "docker": write_docker_archive(image, d / "busybox-docker.tar", ["busybox:latest"]),
    }


def kfleet_in(server: FleetServer, *args: str) -> int:
    return kfleet(["--kubeconfig", str(server.kubeconfig), *args])


def test_import_oci_and_docker_archives(fleet_server, agent, store, archives, capsys):
    assert store.list() == []
    code = kfleet_in(fleet_server, "image", "import", str(archives["oci"]), str(archives["docker"]))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines() == ["imported docker.io/library/busybox:oci",
                                "imported docker.io/library/busybox:latest"]
    refs = {r.ref: r for r in store.list()}
    assert set(refs) == {"docker.io/library/busybox:oci", "docker.io/library/busybox:latest"}
    # One image, two names: both archives carry the same config.
    assert refs["docker.io/library/busybox:oci"].id == refs["docker.io/library/busybox:latest"].id
    assert not list((store.root / "tmp").iterdir()), "the upload's temp file was left behind"

    code = kfleet_in(fleet_server, "image", "list", "--node", NODE)
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["IMAGE", "ID", "SIZE"]
    assert [line.split()[0] for line in lines[1:]] == sorted(refs)
    short_id = refs["docker.io/library/busybox:latest"].id.removeprefix("sha256:")[:12]
    assert all(line.split()[1] == short_id for line in lines[1:])


def test_garbage_archive_fails_with_the_agents_message(fleet_server, agent, store, tmp_path,
                                                       capsys):
    before = store.list()
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar archive\n" * 100)
    code = kfleet_in(fleet_server, "image", "import", str(junk))
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert "Error from server (BadRequest): the uploaded archive: not a readable tar archive" in err
    assert store.list() == before

    code = kfleet_in(fleet_server, "image", "import", str(tmp_path / "missing.tar"))
    assert code == 1
    assert "missing.tar: no such file" in capsys.readouterr().err


def test_several_nodes_need_a_choice(fleet_server, agent, archives, capsys):
    register_node(fleet_server, "n2", agent.port)
    try:
        code = kfleet_in(fleet_server, "image", "list")
        assert code == 1
        assert "a node must be specified with --node, choose one of: [n1 n2]" in \
            capsys.readouterr().err
        code = kfleet_in(fleet_server, "image", "import", "--node", "ghost", str(archives["oci"]))
        assert code == 1
        assert 'Error from server (NotFound): nodes "ghost" not found' in capsys.readouterr().err
    finally:
        with fleet_server.client() as http:
            http.delete("/api/v1/nodes/n2")
