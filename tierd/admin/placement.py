"""Admin endpoints of placement (``tierctl warmup/evict/pin/unpin/policy/du/persist/import``).

All take a ``prefix`` (``bucket/key-prefix``), checked first (:mod:`tierd.admin.prefix`: a
missing bucket is ``404 no_such_bucket``); bodies are JSON.  ``warmup`` streams one JSON
document per line (progress, then ``{"done": total, ...}``) so the CLI can draw a progress bar
without polling.  The door asks the daemon's :class:`~tierd.placement.ops.PlacementOps`.
``GET /v1/tiers`` (:func:`tiers_doc`) and ``GET /v1/placement/ls``
(:mod:`tierd.admin.residency`) are here too.  ``DELETE /v1/placement/policy?prefix=P``
removes a prefix's policy (``404 no_such_policy`` when it has none).  The same operations as
asynchronous jobs with progress and cancel: :mod:`tierd.admin.jobs`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tierd.admin.backend import BACKEND, ready
from tierd.admin.backend import json_error as _err
from tierd.admin.prefix import check_prefix, prefix_error
from tierd.admin.residency import ls_doc, parse_limit
from tierd.errors import FsError
from tierd.meta import PlacementPolicy
from tierd.placement.ops import PlacementOps
from tierd.tiers import TierError


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        doc = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(reason="the body is not JSON") from None
    if not isinstance(doc, dict):
        raise web.HTTPBadRequest(reason="the body must be a JSON object")
    return doc


routes = web.RouteTableDef()


def _ops(request: web.Request) -> PlacementOps:
    return ready(request.app[BACKEND].placement_ops(), "placement is not running")


async def _guarded(fn: Callable[[], Any]) -> web.Response:
    try:
        return web.json_response(await fn())
    except ValueError as e:
        return _err(400, "bad_request", str(e))
    except (TierError, FsError) as e:
        return _err(503, "cold_unavailable", str(e))


async def _prefixed(request: web.Request, doc: Any, fn: Callable[[PlacementOps, str], Any],
                    need_bucket: bool = True) -> web.Response:
    """``fn(ops, prefix)`` once the prefix of ``doc`` passed :func:`check_prefix`."""
    o = _ops(request)
    try:
        prefix = check_prefix(o.p.meta, doc.get("prefix", ""), need_bucket)
    except (ValueError, LookupError) as e:
        return prefix_error(e)
    return await _guarded(lambda: fn(o, prefix))


@routes.get("/v1/tiers")
async def tiers(request: web.Request) -> web.Response:
    return web.json_response(tiers_doc(_ops(request)))


@routes.get("/v1/placement/du")
async def du(request: web.Request) -> web.Response:
    return await _prefixed(request, request.query, lambda o, prefix: _ready(o.du(prefix)))


@routes.get("/v1/placement/ls")
async def ls(request: web.Request) -> web.Response:
    try:
        limit = parse_limit(request.query.get("limit"))
    except ValueError as e:
        return _err(400, "bad_request", str(e))
    return await _prefixed(request, request.query,
                           lambda o, prefix: _ready(ls_doc(o, prefix, limit)))


@routes.post("/v1/placement/evict")
async def evict(request: web.Request) -> web.Response:
    doc = await _body(request)
    tier = str(doc.get("tier") or "all")
    return await _prefixed(request, doc, lambda o, prefix: o.evict(prefix, tier))


@routes.post("/v1/placement/pin")
@routes.post("/v1/placement/unpin")
async def pin(request: web.Request) -> web.Response:
    on = request.path.endswith("/pin")
    return await _prefixed(request, await _body(request),
                           lambda o, prefix: o.set_policy(prefix, pin=on),
                           need_bucket=on)  # unpin may clean up after a removed bucket


@routes.get("/v1/placement/policy")
async def policy_get(request: web.Request) -> web.Response:
    return web.json_response({"policies": _ops(request).policies()})


@routes.put("/v1/placement/policy")
async def policy_set(request: web.Request) -> web.Response:
    doc = await _body(request)
    return await _prefixed(request, doc, lambda o, prefix: o.set_policy(
        prefix, mode=doc.get("mode"), pin=doc.get("pin"), tier=doc.get("tier")))


@routes.delete("/v1/placement/policy")
async def policy_delete(request: web.Request) -> web.Response:
    o = _ops(request)
    prefix = request.query.get("prefix", "")
    if prefix not in o.p.policies:
        return _err(404, "no_such_policy", f"no placement policy for prefix {prefix!r} "
                    "(tierctl policy get lists them)")
    default = PlacementPolicy(prefix)  # set_policy drops a policy equal to the default
    await o.set_policy(prefix, mode=default.mode, pin=default.pin, tier=default.tier)
    return web.json_response({"prefix": prefix, "deleted": True})


@routes.post("/v1/placement/persist")
async def persist(request: web.Request) -> web.Response:
    doc = await _body(request)
    timeout = doc.get("timeout")
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, int | float)
                                or not 0 <= timeout <= 1e9):
        return _err(400, "bad_request", "timeout must be a number of seconds (0 to 1e9)")
    return await _prefixed(request, doc, lambda o, prefix: o.persist_wait(
        prefix, float(timeout) if timeout is not None else None))


@routes.post("/v1/placement/import")
async def import_(request: web.Request) -> web.Response:
    return await _prefixed(request, await _body(request),
                           lambda o, prefix: o.import_prefix(prefix))


@routes.post("/v1/placement/warmup")
async def warmup(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    tier = str(body["tier"]) if body.get("tier") else None
    o = _ops(request)
    try:
        prefix = check_prefix(o.p.meta, body.get("prefix", ""))
    except (ValueError, LookupError) as e:
        return prefix_error(e)
    if tier is not None:
        try:
            o.check_tier(tier)
        except ValueError as e:
            return _err(400, "bad_request", str(e))
    # the first document (the import of the prefix, the count) before the 200: a
    # failure there is still an error status, not a line inside a successful answer
    gen = o.warmup(prefix, tier)
    try:
        first = await anext(gen)
    except (TierError, FsError) as e:
        return _err(503, "cold_unavailable", str(e))
    except ValueError as e:
        return _err(400, "bad_request", str(e))
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    await resp.write(json.dumps(first).encode() + b"\n")
    try:
        async for doc in gen:
            await resp.write(json.dumps(doc).encode() + b"\n")
    except (TierError, FsError) as e:
        await resp.write(json.dumps({"error": "cold_unavailable",
                                     "message": str(e)}).encode() + b"\n")
    await resp.write_eof()
    return resp


def _ratio(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 4) if hits + misses else None


def _redacted(url: str) -> str:
    """``url`` without a ``user:password@`` part (fsspec URLs may carry one)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


def tiers_doc(o: PlacementOps) -> dict[str, Any]:
    """``GET /v1/tiers``: each tier's capacity and use from placement's running accounts
    (no walk of the namespace: ``du`` does that), dirty bytes (they are on hot until
    persisted) and read hits: ``hits`` are reads served without fetching (hot, or mem for
    the memory tier), ``misses`` reads that had to fetch blocks from warm or cold."""
    p = o.p
    hits, misses = p.stats.hits, p.stats.misses
    out: list[dict[str, Any]] = []
    if p.mem is not None:
        mem = p.mem
        out.append({"name": "mem", "kind": "memory", "capacity": mem.capacity,
                    "used": mem.used, "free": max(0, mem.capacity - mem.used),
                    "files": len(mem.copies), "dirty": 0, "hits": int(mem.stats["hits"]),
                    "misses": None, "hit_ratio": None})
    for tc in p.tiers():
        doc: dict[str, Any] = {
            "name": tc.name, "kind": "local", "capacity": tc.capacity, "used": tc.used,
            "free": max(0, tc.capacity - tc.used), "files": len(tc.resident),
            "high_watermark": tc.high, "low_watermark": tc.low,
            "dirty": p.dirty_bytes if tc is p.hotc else 0,
            "hits": None, "misses": None, "hit_ratio": None}
        if tc is p.hotc:
            doc.update(hits=hits, misses=misses, hit_ratio=_ratio(hits, misses))
        out.append(doc)
    cold = p.cold_status()
    out.append({"name": "cold", "kind": "object",
                "url": _redacted(str(getattr(p.cold, "url", ""))),
                "reachable": cold["reachable"], "reason": cold["reason"],
                "last_answer_seconds_ago": cold["last_answer_seconds_ago"],
                "pending_deletes": cold["pending_deletes"],
                "capacity": None, "used": None, "free": None,
                "dirty": 0, "hits": None, "misses": None, "hit_ratio": None,
                "uploaded_bytes": p.stats.uploaded_bytes,
                "fetched_bytes": p.stats.fetched_bytes})
    return {"tiers": out, "dirty": p.dirty_bytes, "dirty_limit": p.settings.dirty_limit,
            "hits": hits, "misses": misses, "hit_ratio": _ratio(hits, misses)}


async def _ready(value: dict[str, Any]) -> dict[str, Any]:
    return value
