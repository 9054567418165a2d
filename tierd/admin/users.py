"""Admin endpoints of users and access keys (``tierctl user ...`` and ``tierctl key ...``).

* ``GET /v1/users`` -- ``{"users": [{name, uid, gid, groups, admin, created_ns, keys}]}``
* ``POST /v1/users`` ``{"name", "uid", "gid"?, "groups"?, "admin"?}`` -- 201, the user
* ``GET /v1/users/{name}`` -- the user and its keys
* ``DELETE /v1/users/{name}`` -- removes the user and its keys, never its files
* ``GET /v1/keys[?user=NAME]`` -- ``{"keys": [{access_key, user, enabled, created_ns}]}``
* ``POST /v1/keys`` ``{"user", "access_key"?, "secret"?}`` -- 201 with the ``secret``: the
  only answer that ever contains it
* ``POST /v1/keys/{id}/disable``, ``POST /v1/keys/{id}/enable``, ``DELETE /v1/keys/{id}``

Errors: 400 ``invalid``, 404 ``not_found``, 409 ``conflict``.  Changes are logged with the
caller's identity (the auth middleware logs the request; these lines say what changed).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tierd.acl.users import Directory, DirectoryError, key_doc, user_doc
from tierd.admin.auth import identity
from tierd.admin.backend import BACKEND, json_error, ready
from tierd.logs import get_logger, kv
from tierd.meta import MetaStore
from tierd.meta.atxn import off_loop

log = get_logger("admin")

_STATUS = {"invalid": 400, "not_found": 404, "conflict": 409}


def _err(e: DirectoryError) -> web.Response:
    return json_error(_STATUS.get(e.code, 400), e.code, str(e))


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        doc = await request.json()
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deeply
        raise DirectoryError("invalid", "the body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise DirectoryError("invalid", "the body must be a JSON object")
    return doc


async def _durable(meta: MetaStore) -> None:
    await meta.flush()


routes = web.RouteTableDef()
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _directory(request: web.Request) -> Directory:
    return ready(request.app[BACKEND].directory(), "the user directory is not ready")


def _guarded(fn: _Handler) -> _Handler:
    """``fn`` with a :class:`DirectoryError` answered as its JSON error."""
    @functools.wraps(fn)
    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except DirectoryError as e:
            return _err(e)
    return run


@routes.get("/v1/users")
@_guarded
async def users_list(request: web.Request) -> web.Response:
    return web.json_response({"users": [user_doc(u, n)
                                        for u, n in _directory(request).list_users()]})


@routes.post("/v1/users")
@_guarded
async def user_add(request: web.Request) -> web.Response:
    d = _directory(request)
    doc = await _body(request)
    user = await off_loop(d.meta, d.add_user, doc.get("name"), doc.get("uid"),
                          doc.get("gid"), doc.get("groups", []), doc.get("admin", False))
    await _durable(d.meta)
    log.info("user added", extra=kv(identity=identity(request), user=user.name,
                                    uid=user.uid, gid=user.gid, admin=user.admin))
    return web.json_response(user_doc(user, 0), status=201)


@routes.get("/v1/users/{name}")
@_guarded
async def user_get(request: web.Request) -> web.Response:
    d = _directory(request)
    name = request.match_info["name"]
    user = d.get_user(name)
    keys = d.list_keys(name)
    doc = user_doc(user, len(keys))
    doc["key_list"] = [key_doc(k) for k in keys]
    return web.json_response(doc)


@routes.delete("/v1/users/{name}")
@_guarded
async def user_delete(request: web.Request) -> web.Response:
    d = _directory(request)
    name = request.match_info["name"]
    removed = await off_loop(d.meta, d.delete_user, name)
    await _durable(d.meta)
    log.info("user deleted", extra=kv(identity=identity(request), user=name,
                                      keys_removed=",".join(removed) or "-"))
    return web.json_response({"deleted": name, "keys_removed": removed})


@routes.get("/v1/keys")
@_guarded
async def keys_list(request: web.Request) -> web.Response:
    user = request.query.get("user")
    return web.json_response({"keys": [key_doc(k)
                                       for k in _directory(request).list_keys(user or None)]})


@routes.post("/v1/keys")
@_guarded
async def key_add(request: web.Request) -> web.Response:
    d = _directory(request)
    doc = await _body(request)
    user = doc.get("user")
    if not isinstance(user, str):
        raise DirectoryError("invalid", "the body needs \"user\": the key's user name")
    new = await off_loop(d.meta, d.add_key, user, doc.get("access_key"), doc.get("secret"))
    await _durable(d.meta)
    log.info("access key added", extra=kv(identity=identity(request), user=user,
                                          access_key=new.key.access_key))
    out = key_doc(new.key)
    out["secret"] = new.secret
    return web.json_response(out, status=201)


@routes.post("/v1/keys/{key}/{action:enable|disable}")
@_guarded
async def key_toggle(request: web.Request) -> web.Response:
    d = _directory(request)
    ak = request.match_info["key"]
    enabled = request.match_info["action"] == "enable"
    key = await off_loop(d.meta, d.set_enabled, ak, enabled)
    await _durable(d.meta)
    log.info("access key " + ("enabled" if enabled else "disabled"),
             extra=kv(identity=identity(request), user=key.user, access_key=ak))
    return web.json_response(key_doc(key))


@routes.delete("/v1/keys/{key}")
@_guarded
async def key_delete(request: web.Request) -> web.Response:
    d = _directory(request)
    ak = request.match_info["key"]
    key = await off_loop(d.meta, d.delete_key, ak)
    await _durable(d.meta)
    log.info("access key deleted", extra=kv(identity=identity(request), user=key.user,
                                            access_key=ak))
    return web.json_response({"deleted": ak, "user": key.user})
