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

from collections.abc import Callable
from typing import Any

from aiohttp import web

from tierd.acl.users import Directory, DirectoryError, key_doc, user_doc
from tierd.admin.auth import identity
from tierd.logs import get_logger, kv
from tierd.meta import MetaStore

log = get_logger("admin")

_STATUS = {"invalid": 400, "not_found": 404, "conflict": 409}

GetDirectory = Callable[[], Directory | None]


def _err(e: DirectoryError) -> web.Response:
    return web.json_response({"error": e.code, "message": str(e)},
                             status=_STATUS.get(e.code, 400))


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


def add_user_routes(app: web.Application, get_directory: GetDirectory) -> None:
    def directory() -> Directory:
        d = get_directory()
        if d is None:
            raise web.HTTPServiceUnavailable(reason="the user directory is not ready")
        return d

    def guarded(fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def run(request: web.Request) -> web.StreamResponse:
            try:
                resp: web.StreamResponse = await fn(request)
                return resp
            except DirectoryError as e:
                return _err(e)
        return run

    async def users_list(request: web.Request) -> web.Response:
        return web.json_response({"users": [user_doc(u, n)
                                            for u, n in directory().list_users()]})

    async def user_add(request: web.Request) -> web.Response:
        d = directory()
        doc = await _body(request)
        user = d.add_user(doc.get("name"), doc.get("uid"), doc.get("gid"),
                          doc.get("groups", []), doc.get("admin", False))
        await _durable(d.meta)
        log.info("user added", extra=kv(identity=identity(request), user=user.name,
                                        uid=user.uid, gid=user.gid, admin=user.admin))
        return web.json_response(user_doc(user, 0), status=201)

    async def user_get(request: web.Request) -> web.Response:
        d = directory()
        name = request.match_info["name"]
        user = d.get_user(name)
        keys = d.list_keys(name)
        doc = user_doc(user, len(keys))
        doc["key_list"] = [key_doc(k) for k in keys]
        return web.json_response(doc)

    async def user_delete(request: web.Request) -> web.Response:
        d = directory()
        name = request.match_info["name"]
        removed = d.delete_user(name)
        await _durable(d.meta)
        log.info("user deleted", extra=kv(identity=identity(request), user=name,
                                          keys_removed=",".join(removed) or "-"))
        return web.json_response({"deleted": name, "keys_removed": removed})

    async def keys_list(request: web.Request) -> web.Response:
        user = request.query.get("user")
        return web.json_response({"keys": [key_doc(k)
                                           for k in directory().list_keys(user or None)]})

    async def key_add(request: web.Request) -> web.Response:
        d = directory()
        doc = await _body(request)
        user = doc.get("user")
        if not isinstance(user, str):
            raise DirectoryError("invalid", "the body needs \"user\": the key's user name")
        new = d.add_key(user, doc.get("access_key"), doc.get("secret"))
        await _durable(d.meta)
        log.info("access key added", extra=kv(identity=identity(request), user=user,
                                              access_key=new.key.access_key))
        out = key_doc(new.key)
        out["secret"] = new.secret
        return web.json_response(out, status=201)

    async def key_toggle(request: web.Request) -> web.Response:
        d = directory()
        ak = request.match_info["key"]
        enabled = request.match_info["action"] == "enable"
        key = d.set_enabled(ak, enabled)
        await _durable(d.meta)
        log.info("access key " + ("enabled" if enabled else "disabled"),
                 extra=kv(identity=identity(request), user=key.user, access_key=ak))
        return web.json_response(key_doc(key))

    async def key_delete(request: web.Request) -> web.Response:
        d = directory()
        ak = request.match_info["key"]
        key = d.delete_key(ak)
        await _durable(d.meta)
        log.info("access key deleted", extra=kv(identity=identity(request), user=key.user,
                                                access_key=ak))
        return web.json_response({"deleted": ak, "user": key.user})

    app.router.add_get("/v1/users", guarded(users_list))
    app.router.add_post("/v1/users", guarded(user_add))
    app.router.add_get("/v1/users/{name}", guarded(user_get))
    app.router.add_delete("/v1/users/{name}", guarded(user_delete))
    app.router.add_get("/v1/keys", guarded(keys_list))
    app.router.add_post("/v1/keys", guarded(key_add))
    app.router.add_post("/v1/keys/{key}/{action:enable|disable}", guarded(key_toggle))
    app.router.add_delete("/v1/keys/{key}", guarded(key_delete))
