"""The agent's image routes (images_api) on the real agent app, through Quart's test client.

Checked here, where it is cheap: archive import of both formats with the refs
returned, the importer's message on a bad archive (with the temp path hidden),
the size limit by declared length and by counted bytes, and that no upload is
left in the store's tmp/.  The full path through the API server and kfleet is in
tests/e2e/test_image_import.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet.agent.api import create_app, serve, split_rule
from fleet.agent.images_api import image_routes
from fleet.runtime.images import ImageStore
from fleet.testing.oci_image import (
    build_busybox_image,
    busybox_problem,
    write_docker_archive,
    write_oci_archive,
)

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class NoPods:
    def find(self, namespace: str, pod: str, container: str | None) -> None:
        return None

    def all(self) -> list[Any]:
        return []


def client(store: ImageStore, max_bytes: int = 1 << 30) -> Any:
    app = create_app(NoPods(), token=TOKEN, extra_routes=image_routes(store, max_bytes=max_bytes))
    return app.test_client()


@pytest.mark.parametrize("rule,expected", [
    ("/images", (["GET"], "/images")),
    ("POST /images/import", (["POST"], "/images/import")),
    ("get,DELETE /things/<name>", (["GET", "DELETE"], "/things/<name>")),
])
def test_split_rule(rule, expected):
    assert split_rule(rule) == expected


@pytest.mark.skipif(busybox_problem() is not None, reason=str(busybox_problem()))
async def test_import_both_formats_and_list(tmp_path: Path):
    store = ImageStore(tmp_path / "store")
    image = build_busybox_image()
    oci = write_oci_archive(image, tmp_path / "oci.tar", ref=None)  # unnamed: ?name= names it
    docker = write_docker_archive(image, tmp_path / "docker.tar", ["busybox:1.36"])
    c = client(store)
    resp = await c.post("/images/import", data=oci.read_bytes(), headers=AUTH,
                        query_string={"name": "example.com/tools/busybox"})
    assert resp.status_code == 200, await resp.get_data()
    assert await resp.get_json() == {"images": ["example.com/tools/busybox:latest"]}
    resp = await c.post("/images/import", data=docker.read_bytes(), headers=AUTH)
    assert await resp.get_json() == {"images": ["docker.io/library/busybox:1.36"]}

    resp = await c.get("/images", headers=AUTH)
    listed = (await resp.get_json())["images"]
    assert [i["ref"] for i in listed] == ["docker.io/library/busybox:1.36",
                                         "example.com/tools/busybox:latest"]
    assert {i["id"] for i in listed} == {image.config_digest}
    assert all(i["size"] > 0 for i in listed)
    assert not list((store.root / "tmp").iterdir())


async def test_bad_archive_is_400_with_the_importers_message(tmp_path: Path):
    store = ImageStore(tmp_path / "store")
    resp = await client(store).post("/images/import", data=b"garbage" * 1000, headers=AUTH)
    assert resp.status_code == 400
    body = await resp.get_json()
    assert (body["kind"], body["reason"]) == ("Status", "BadRequest")
    assert body["message"].startswith("the uploaded archive: not a readable tar archive")
    assert str(store.root) not in body["message"]
    assert store.list() == []
    assert not list((store.root / "tmp").iterdir())

    resp = await client(store).post("/images/import", data=b"", headers=AUTH)
    assert resp.status_code == 400
    assert (await resp.get_json())["message"] == "no archive in the request body"


async def test_size_limit_over_a_real_socket(tmp_path: Path):
    """Both refusals reach an HTTP client that is still uploading as a 413 Status
    (the route reads the rest into nothing instead of resetting the connection)."""
    store = ImageStore(tmp_path / "store")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve, NoPods(), address="127.0.0.1", port=0,
                                          token=TOKEN,
                                          extra_routes=image_routes(store, max_bytes=100_000)))

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(40):
                yield b"y" * 10_000

        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            resp = await http.post("/images/import", content=b"x" * 40_000_000)
            assert resp.status_code == 413
            assert resp.json()["message"] == "the archive is 40000000 bytes; the limit is 100000"
            resp = await http.post("/images/import", content=chunks())
            assert resp.status_code == 413
            assert resp.json()["message"] == "the archive is larger than the limit of 100000 bytes"
        nursery.cancel_scope.cancel()
    assert store.list() == []
    assert not list((store.root / "tmp").iterdir())


async def test_routes_need_the_token(tmp_path: Path):
    store = ImageStore(tmp_path / "store")
    c = client(store)
    assert (await c.get("/images")).status_code == 401
    assert (await c.post("/images/import", data=b"x")).status_code == 401
