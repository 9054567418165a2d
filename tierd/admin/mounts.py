"""``/v1/mounts``: the daemon's FUSE mount, attached and removed while it runs
(``tierctl mount list/add/rm``).

A running daemon holds its data directory's lock, so a second ``tierd serve --mount`` or
``tierd mount`` on the same data refuses to start.  The mount therefore comes from the
daemon that is already serving: ``POST`` asks it to mount its namespace, ``DELETE`` to
unmount it.  One mount per daemon (pyfuse3 has one FUSE session per process).

* ``GET /v1/mounts`` -- ``{"mounts": [{"door": "fuse", "mountpoint", "source": "/"}]}``;
* ``POST /v1/mounts`` ``{"mountpoint": "/abs/dir"}`` -- ``201`` with the mount.  The mount
  point must be an absolute path to an existing, empty directory: an API call creates no
  directories and hides no files (a typo does not end up as a new directory with the
  namespace over it).  ``409 mount_refused`` when the daemon has a mount already or the
  FUSE door refuses (something else mounted there, no ``/dev/fuse``), with the reason;
* ``DELETE /v1/mounts?mountpoint=/abs/dir`` -- unmount, as at shutdown (a mount still in
  use is detached lazily; processes with files open on it then get ``ENOTCONN``);
  ``404 not_mounted`` when this daemon has no mount there.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from tierd.admin.auth import identity
from tierd.admin.backend import BACKEND, AdminBackend, json_error
from tierd.logs import get_logger, kv

log = get_logger("admin")


def mounts_doc(backend: AdminBackend) -> dict[str, Any]:
    """The ``GET /v1/mounts`` document (none while the daemon serves no mount)."""
    fuse = backend.fuse
    found = [] if fuse is None else [{"door": "fuse", "mountpoint": str(fuse.mountpoint),
                                      "source": "/"}]
    return {"mounts": found}


def _mountpoint(raw: object) -> Path:
    """An absolute, normalised path; ValueError otherwise."""
    if not isinstance(raw, str) or not raw:
        raise ValueError("mountpoint must be an absolute path (a string)")
    if "\0" in raw or not raw.startswith("/"):
        raise ValueError(f"mountpoint must be an absolute path, not {raw!r}")
    return Path(os.path.normpath(raw))


def _check_dir(path: Path) -> str | None:
    """Why ``path`` is no place for a mount (None: an existing empty directory, or a stale
    mount the FUSE door will clear).  Runs in a thread: stat and readdir touch the disk."""
    try:
        if not path.is_dir():
            return (f"mount point {path} does not exist or is not a directory: create it "
                    f"first (mkdir -p {path})")
        with os.scandir(path) as it:
            if next(it, None) is not None:
                return (f"mount point {path} is not empty: the mount would hide its files; "
                        "choose an empty directory")
    except OSError as e:
        if e.errno == errno.ENOTCONN:  # a dead tierd's mount: cleared before mounting
            return None
        return f"cannot use mount point {path}: {e.strerror}"
    return None


routes = web.RouteTableDef()


@routes.get("/v1/mounts")
async def listing(request: web.Request) -> web.Response:
    return web.json_response(mounts_doc(request.app[BACKEND]))


@routes.post("/v1/mounts")
async def add(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    try:
        doc = await request.json()
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or set(doc) - {"mountpoint"}:
        return json_error(400, "bad_request", 'the body must be {"mountpoint": "/dir"}')
    try:
        path = _mountpoint(doc.get("mountpoint"))
    except ValueError as e:
        return json_error(400, "bad_request", str(e))
    if backend.fuse is not None:
        return json_error(409, "mount_refused", "this tierd already serves a mount at "
                          f"{backend.fuse.mountpoint} (one per daemon): remove it first")
    why = await asyncio.to_thread(_check_dir, path)
    if why is not None:
        return json_error(400, "bad_request", why)
    try:  # the FUSE door needs pyfuse3 and libfuse3 only when a mount is asked for
        from tierd_fuse import MountError
    except ImportError as e:
        return json_error(503, "unavailable", f"the FUSE door is not installed: {e}")
    try:
        await backend.attach_mount(path)
    except MountError as e:
        return json_error(409, "mount_refused", str(e))
    log.info("mount attached", extra=kv(identity=identity(request), mountpoint=str(path)))
    (mount,) = mounts_doc(backend)["mounts"]
    return web.json_response(mount, status=201)


@routes.delete("/v1/mounts")
async def remove(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    try:
        path = _mountpoint(request.query.get("mountpoint"))
    except ValueError as e:
        return json_error(400, "bad_request", str(e))
    fuse = backend.fuse
    if fuse is None or Path(fuse.mountpoint) != path:
        have = "none" if fuse is None else str(fuse.mountpoint)
        return json_error(404, "not_mounted", f"this tierd has no mount at {path} "
                          f"(its mount: {have})")
    await backend.detach_mount()
    log.info("mount removed", extra=kv(identity=identity(request), mountpoint=str(path)))
    return web.json_response({"mountpoint": str(path), "unmounted": True})
