"""The agent's image endpoints: archive import (backs `kfleet image import`) and listing.

    POST /images/import[?name=REPO]   body: an OCI-layout or `docker save` tar (maybe gzipped)
                                      → 200 {"images": ["docker.io/library/busybox:latest", ...]}
    GET  /images                      → 200 {"images": [{"ref", "id", "size"}, ...]}

They are added to the agent API with `serve(..., extra_routes=image_routes(store))`,
so they sit behind the agent's token check, and clients reach them through the API
server's `nodes/{name}/proxy/images/...`: an image lands on the node that will run it
without the client ever talking to the node directly.

The upload is written to a file under the store's own `tmp/` as it arrives — never
held in memory, and on the same filesystem as the blobs it becomes — and is capped
(4 GiB by default) so a runaway client cannot fill the node's disk.  The store sweeps
`tmp/` when it opens, so an agent killed mid-upload leaves nothing behind for long.
The import itself is blocking tar work that `import_archive` runs in a worker thread,
keeping the agent's event loop (probes, logs, exec) responsive meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from quart import Response, request

from fleet.api.errors import BadRequest, RequestEntityTooLarge
from fleet.runtime.images import ImageError, ImageStore, import_archive

MAX_ARCHIVE_BYTES = 4 << 30
# Upload chunks from the HTTP server are small; batch them into fewer thread hops.
_WRITE_BATCH = 1 << 20
UPLOAD_NAME = "the uploaded archive"


def _json(doc: Any) -> Response:
    return Response(json.dumps(doc), content_type="application/json")


def _declared_length() -> int | None:
    raw = request.headers.get("Content-Length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"invalid Content-Length {raw!r}") from None


async def _discard_rest() -> None:
    # A client reads no response before its upload is done (HTTP/1.1 clients, and
    # the API server relaying one), and closing on unread data resets the
    # connection: so a refused upload is read to its end, into nothing, and the
    # client gets the 413 Status instead of "connection reset".
    async for _ in request.body:
        pass


async def receive_upload(dest: Path, limit: int) -> int:
    """Stream the request body into `dest`; returns its size.

    Refuses (413) a body declared or found to be larger than `limit`, and (400) one
    that ends before its declared length (the client went away mid-upload).
    """
    declared = _declared_length()
    if declared is not None and declared > limit:
        await _discard_rest()
        raise RequestEntityTooLarge(f"the archive is {declared} bytes; the limit is {limit}")
    size = 0
    pending: list[bytes] = []
    pending_size = 0
    async with await trio.open_file(dest, "wb") as f:
        async for chunk in request.body:
            size += len(chunk)
            if size > limit:
                await _discard_rest()
                raise RequestEntityTooLarge(f"the archive is larger than the limit of {limit} bytes")
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size >= _WRITE_BATCH:
                await f.write(b"".join(pending))
                pending, pending_size = [], 0
        if pending:
            await f.write(b"".join(pending))
    if declared is not None and size != declared:
        raise BadRequest(f"the upload ended after {size} of {declared} bytes")
    if size == 0:
        raise BadRequest("no archive in the request body")
    return size


def image_routes(store: ImageStore, *, max_bytes: int = MAX_ARCHIVE_BYTES
                 ) -> dict[str, Callable[..., Awaitable[Response]]]:
    """The routes for `fleet.agent.api.serve(extra_routes=...)`."""

    async def import_images() -> Response:
        upload = store.root / "tmp" / f"upload-{uuid.uuid4().hex}.tar"
        try:
            await receive_upload(upload, max_bytes)
            try:
                refs = await import_archive(store, upload, name=request.args.get("name") or None)
            except ImageError as e:
                # The importer names the file it read; the client knows it by another name.
                raise BadRequest(str(e).replace(str(upload), UPLOAD_NAME)) from None
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(FileNotFoundError):
                await trio.to_thread.run_sync(os.unlink, upload)
        return _json({"images": refs})

    async def list_images() -> Response:
        return _json({"images": [{"ref": r.ref, "id": r.id, "size": r.size}
                                 for r in store.list()]})

    return {"POST /images/import": import_images, "GET /images": list_images}
