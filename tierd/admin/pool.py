"""Admin endpoints of the memory pool and checkpoints (``tierctl pool`` and ``tierctl ckpt``).

``GET /v1/pool`` (status), ``PUT /v1/pool/quota/{tenant}`` (``{"bytes": N}``; 0 removes
the tenant's own quota), ``DELETE /v1/pool/regions/{id}``, and checkpoints:

* ``GET /v1/ckpt?bucket=B&run=R`` -- one run's steps and where each is;
* ``GET /v1/ckpt[?bucket=B]`` -- every run with its steps (``{"bucket", "runs": [...]}``):
  of bucket ``B``, the runs this daemon has seen and every directory holding a step (so a
  restarted daemon lists the runs on disk too; a missing ``B`` is ``404 no_such_bucket``);
  without ``bucket``, every run seen since start and those on disk in ``checkpoints``;
* ``DELETE /v1/ckpt?bucket=B&run=R&step=N`` -- remove a step (``{"deleted": N}``; a missing ``B`` is
  ``404 no_such_bucket``; ``409``
  while it is still being written out).
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from aiohttp import web

from tierd.acl import Identity
from tierd.acl.users import MAX_ID
from tierd.admin.backend import BACKEND, json_error, ready
from tierd.admin.prefix import NoSuchBucket, prefix_error
from tierd.errors import FsError
from tierd.mempool.pool import PoolError
from tierd.namespace.names import check_bucket_name

if TYPE_CHECKING:
    from tierd.checkpoint.door import MemoryDoor

_STATUS = {"ENOENT": 404, "EBUSY": 409, "EINVAL": 400}
#: the bucket of checkpoints when none is named (the SDK's default too)
DEFAULT_BUCKET = "checkpoints"


def _err(e: OSError) -> web.Response:
    name = errno.errorcode.get(e.errno or 0, "EIO")
    return json_error(_STATUS.get(name, 400), name.lower(), e.strerror or str(e))


routes = web.RouteTableDef()


def _door(request: web.Request) -> MemoryDoor:
    return ready(request.app[BACKEND].memory_door(), "the memory pool is not running")


@routes.get("/v1/pool")
async def status(request: web.Request) -> web.Response:
    return web.json_response(_door(request).status())


@routes.put("/v1/pool/quota/{tenant}")
async def quota(request: web.Request) -> web.Response:
    try:
        tenant = int(request.match_info["tenant"])
        doc = await request.json()
        nbytes = int(doc["bytes"])
        if not (0 <= tenant <= MAX_ID and 0 <= nbytes < 1 << 63):
            raise ValueError(f"tenant is 0 to {MAX_ID}, bytes 0 to 2^63-1")
        return web.json_response(await _door(request).set_quota(tenant, nbytes))
    except (ValueError, KeyError, TypeError) as e:
        return json_error(400, "bad_request",
                          f"need a numeric tenant and a JSON body {{\"bytes\": N}}: {e}")


@routes.delete("/v1/pool/regions/{rid}")
async def free(request: web.Request) -> web.Response:
    try:
        return web.json_response(_door(request).free_region(int(request.match_info["rid"])))
    except ValueError:
        return json_error(400, "bad_request", "region ids are numbers")
    except PoolError as e:
        return _err(e)


async def _missing_bucket(d: MemoryDoor, bucket: str | None) -> web.Response | None:
    """The answer when ``bucket`` is named and does not exist: ``404 no_such_bucket``
    as the placement endpoints answer (:func:`tierd.admin.prefix.check_prefix`), before
    a delete would register an empty run that every later listing shows.  The bucket
    is looked up through the namespace, as every door does."""
    if bucket is None:
        return None
    try:
        check_bucket_name(bucket)
        await d.ckpt.ns.get_bucket(bucket)
    except FsError as e:
        if e.errno == errno.ENOENT:
            return prefix_error(NoSuchBucket(f"no such bucket {bucket!r} (tierctl "
                                             "bucket list shows the buckets)"))
        return _err(e)
    return None


@routes.get("/v1/ckpt")
async def ckpt_list(request: web.Request) -> web.Response:
    d = _door(request)
    run_name = request.query.get("run")
    bucket = request.query.get("bucket")
    try:
        if run_name:
            return web.json_response(await d.ckpt.listing(
                Identity.ROOT, {"bucket": bucket, "run": run_name}))
        if (refused := await _missing_bucket(d, bucket)) is not None:
            return refused
        if bucket is not None:
            pairs = {(bucket, name) for name in await d.ckpt.run_names(bucket)}
        else:  # every run seen since start, and those on disk in the default bucket
            pairs = {(r.bucket, r.name) for r in d.ckpt.runs.values()}
            pairs |= {(DEFAULT_BUCKET, n) for n in await d.ckpt.run_names(DEFAULT_BUCKET)}
        runs = [await d.ckpt.listing(Identity.ROOT, {"bucket": b, "run": name})
                for b, name in sorted(pairs)]
    except FsError as e:
        return _err(e)
    return web.json_response({"bucket": bucket, "runs": runs})


@routes.delete("/v1/ckpt")
async def ckpt_delete(request: web.Request) -> web.Response:
    q = request.query
    try:
        step = int(q.get("step", ""))
    except ValueError:
        return json_error(400, "bad_request",
                          "step must be a number (and run= names the run)")
    d = _door(request)
    if (refused := await _missing_bucket(d, q.get("bucket") or None)) is not None:
        return refused
    try:
        n = await d.ckpt.delete(Identity.ROOT, {"bucket": q.get("bucket"),
                                                "run": q.get("run"), "step": step})
    except FsError as e:
        return _err(e)
    return web.json_response({"bucket": q.get("bucket") or DEFAULT_BUCKET,
                              "run": q.get("run"), "deleted": n})
