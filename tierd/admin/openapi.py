"""The admin API's OpenAPI 3.1 document, served at ``GET /v1/openapi.json``.

Written by hand next to the handlers (a Python dict, no generator): the document is the
contract ``tierctl``, scripts and the schemathesis suite (tests/admin/test_openapi.py) hold
the daemon to, so it says what each endpoint takes and answers, error statuses included.

The document is behind the admin token like every other ``/v1`` endpoint: it is the API's
reference, not a secret, but an unauthenticated endpoint would be one more thing for an
operator to reason about on a listener that otherwise answers only ``/healthz`` openly (the
same document is in docs/admin-api.md and in the source).

What is served is :data:`DOCUMENT` restricted to the routes the application really has
(:func:`served`): a daemon built without a part (the memory pool, placement) does not
advertise its endpoints, and a test checks that every registered route is documented and
every documented operation is registered by the daemon (:func:`undocumented`,
:func:`unregistered`).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from aiohttp import web

from tierd import __version__

Schema = dict[str, Any]

_JSON = "application/json"
_METHODS = ("get", "put", "post", "delete", "patch")


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    return {"type": "object", "properties": props, "required": list(required), **extra}


def _n(schema: Schema) -> Schema:
    """``schema`` or null."""
    return {"anyOf": [schema, {"type": "null"}]}


_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NN_INT = {"type": "integer", "minimum": 0}
_ANY_OBJ: Schema = {"type": "object"}

_ERR_DESC = {400: "bad request (the message says what)", 401: "no or wrong credentials",
             403: "a signed request of a user who is not an admin",
             404: "no such thing", 409: "conflict", 413: "body too large",
             429: "too many jobs", 503: "the part is not running (or the cold store is "
             "unavailable)"}


def _op(summary: str, ok: dict[int, tuple[str, Schema | None]], *, errors: tuple[int, ...] = (),
        body: Schema | None = None, body_required: bool = True, params: list[Schema] | None
        = None, tag: str, ctype: str = _JSON) -> Schema:
    """One operation: ``ok`` maps success statuses to (description, JSON schema or None for
    a non-JSON body); every operation may answer 400 (bad input), 401 and 403."""
    responses: dict[str, Any] = {}
    for status, (desc, schema) in ok.items():
        if schema is None:
            responses[str(status)] = {"description": desc,
                                      "content": {ctype: {"schema": _STR}}}
        else:
            responses[str(status)] = {"description": desc,
                                      "content": {_JSON: {"schema": schema}}}
    for status in sorted({400, 401, 403, 413, *errors}):
        responses[str(status)] = {"description": _ERR_DESC[status],
                                  "content": {_JSON: {"schema": _ref("Error")}}}
    op: Schema = {"summary": summary, "tags": [tag], "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": body_required,
                             "content": {_JSON: {"schema": body}}}
    if params:
        op["parameters"] = params
    return op


def _path(name: str, schema: Schema | None = None, desc: str = "") -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema or _STR,
            "description": desc}


def _query(name: str, schema: Schema | None = None, desc: str = "") -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema or _STR,
            "description": desc}


_TIER = {"type": "string", "enum": ["mem", "hot", "warm"]}
#: user names and ids as tierd.acl.users accepts them
_USER = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"}
_ID = {"type": "integer", "minimum": 0, "maximum": 2**32 - 2}
_PREFIX = {"type": "string", "description": "bucket/key-prefix (\"\" is everything)"}

SCHEMAS: dict[str, Schema] = {
    "Error": _obj({"error": _STR, "message": _STR}, ("error", "message")),
    "Status": _obj({"version": _STR, "uptime_seconds": _NUM, "data_dir": _STR, "pid": _INT,
                    "inodes": _INT, "bytes": _INT, "buckets": _INT, "open_files": _INT,
                    "meta": _ANY_OBJ, "listen": {"type": "object",
                                                 "additionalProperties": _STR},
                    "mount": _n(_STR), "pool": _n(_ANY_OBJ), "mem_tier": _n(_ANY_OBJ)},
                   ("version", "uptime_seconds", "data_dir", "pid")),
    "Mounts": _obj({"mounts": {"type": "array", "items": _obj(
        {"door": _STR, "mountpoint": _STR, "source": _STR}, ("door", "mountpoint"))}},
        ("mounts",)),
    "Tier": _obj({"name": _STR, "kind": {"type": "string",
                                         "enum": ["memory", "local", "object"]},
                  "capacity": _n(_INT), "used": _n(_INT), "free": _n(_INT),
                  "files": _INT, "dirty": _INT, "hits": _n(_INT), "misses": _n(_INT),
                  "hit_ratio": _n(_NUM), "high_watermark": _NUM, "low_watermark": _NUM,
                  "url": _STR, "reachable": _BOOL, "reason": _n(_STR),
                  "last_answer_seconds_ago": _NUM, "pending_deletes": _INT,
                  "uploaded_bytes": _INT,
                  "fetched_bytes": _INT},
                 ("name", "kind", "capacity", "used", "free", "dirty", "hits", "misses",
                  "hit_ratio")),
    "Tiers": _obj({"tiers": {"type": "array", "items": _ref("Tier")}, "dirty": _INT,
                   "dirty_limit": _INT, "hits": _INT, "misses": _INT,
                   "hit_ratio": _n(_NUM)},
                  ("tiers", "dirty", "dirty_limit", "hits", "misses", "hit_ratio")),
    "Du": _obj({"prefix": _STR, "files": _INT, "bytes": _INT,
                "tiers": {"type": "object", "additionalProperties": _INT},
                "dirty": _INT, "hot_used": _INT, "hot_capacity": _INT, "dirty_total": _INT,
                "dirty_limit": _INT, "totals": {"type": "object", "additionalProperties":
                                                _obj({"used": _INT, "capacity": _INT})}},
               ("prefix", "files", "bytes", "tiers", "dirty", "totals")),
    "Evicted": _obj({"prefix": _STR, "evicted": _INT,
                     "tiers": {"type": "object", "additionalProperties": _INT}},
                    ("prefix", "evicted", "tiers")),
    "PlacementPolicy": _obj({"prefix": _STR, "mode": _STR, "pin": _BOOL, "tier": _STR},
                            ("prefix", "mode", "pin", "tier")),
    "Job": _obj({
        "id": _STR, "kind": {"type": "string", "enum": ["warmup", "pin", "evict", "persist"]},
        "prefix": _STR, "tier": _n(_STR), "timeout": _n(_NUM),
        "state": {"type": "string",
                  "enum": ["queued", "running", "done", "failed", "cancelled"]},
        "identity": _STR, "created": _NUM, "started": _n(_NUM), "finished": _n(_NUM),
        "elapsed_s": _NUM, "done": {**_NN_INT, "description": "bytes handled"},
        "total": _n(_NN_INT), "files_done": _NN_INT, "files": _n(_NN_INT),
        "bytes_per_s": _NUM, "eta_s": _n(_NUM), "error": _n(_STR), "result": _n(_ANY_OBJ)},
        ("id", "kind", "prefix", "tier", "state", "created", "started", "finished", "done",
         "total", "files_done", "files", "bytes_per_s", "eta_s", "error", "result")),
    "NewJob": _obj({
        "kind": {"type": "string", "enum": ["warmup", "pin", "evict", "persist"]},
        "prefix": _PREFIX,
        "tier": {"type": "string", "description": "warmup/pin: mem, hot or warm; evict: "
                 "mem, hot, warm or all (the default); persist: none"},
        "timeout": {"type": "number", "exclusiveMinimum": 0,
                    "description": "persist only: seconds before the job fails"}},
        ("kind",), additionalProperties=False),
    "User": _obj({"name": _STR, "uid": _INT, "gid": _INT,
                  "groups": {"type": "array", "items": _INT}, "admin": _BOOL,
                  "created_ns": _INT, "keys": _INT,
                  "key_list": {"type": "array", "items": _ref("Key")}},
                 ("name", "uid", "gid", "groups", "admin")),
    "NewUser": _obj({"name": _USER, "uid": _ID, "gid": _ID,
                     "groups": {"type": "array", "items": _ID, "maxItems": 64},
                     "admin": _BOOL}, ("name", "uid")),
    "Key": _obj({"access_key": _STR, "user": _STR, "enabled": _BOOL, "created_ns": _INT},
                ("access_key", "user", "enabled")),
    "NewKey": _obj({"user": _USER, "access_key": {"type": "string",
                                                  "pattern": "^[A-Za-z0-9_.-]{3,128}$"},
                    "secret": {"type": "string", "pattern": "^[!-~]{8,128}$"}}, ("user",)),
    "Bucket": _obj({"name": _STR, "owner_uid": _INT, "owner": _n(_STR), "created_ns": _INT,
                    "created": {"type": "string", "format": "date-time"}, "region": _STR,
                    "acl": _STR, "policy": _BOOL, "public": _BOOL},
                   ("name", "owner_uid", "owner", "created_ns", "created", "region", "acl",
                    "policy", "public")),
    "BucketPolicy": _obj({"bucket": _STR, "policy": _ANY_OBJ, "public": _BOOL},
                         ("bucket", "policy", "public")),
    "S3Policy": _obj({"Version": {"type": "string", "enum": ["2012-10-17", "2008-10-17"]},
                      "Id": _STR, "Statement": {"anyOf": [
                          {"type": "array", "items": _ANY_OBJ}, _ANY_OBJ]}},
                     ("Statement",),
                     description="an S3 bucket policy (the IAM subset of docs/permissions.md)"),
    "Ls": _obj({"prefix": _STR, "files": {"type": "array", "items": _obj({
        "key": _STR, "ino": _INT, "size": _NN_INT, "version": _INT,
        "state": {"type": "string", "enum": ["dirty", "persisting", "clean"]},
        "tiers": {"type": "object", "additionalProperties": _NN_INT,
                  "description": "bytes of the file on mem, hot, warm; cold: the size when "
                  "cold has this version, else 0"},
        "policy": _obj({"mode": _STR, "pin": _BOOL, "tier": _STR}, ("mode", "pin", "tier"))},
        ("key", "size", "state", "tiers", "policy"))},
        "truncated": _BOOL, "limit": _INT, "tiers": {"type": "array", "items": _STR}},
        ("prefix", "files", "truncated", "limit", "tiers")),
    "NewBucket": _obj({"name": _STR, "owner": {**_USER, "description": "the owning user "
                                                "(default: root)"}},
                      ("name",), additionalProperties=False),
    "PoolStatus": _obj({"capacity": _INT, "used": _INT, "free": _INT, "regions": _INT,
                        "tenants": _ANY_OBJ, "socket": _STR,
                        "region_list": {"type": "array", "items": _ANY_OBJ}},
                       ("capacity", "used", "free")),
}


def _users() -> dict[str, Schema]:
    name = _path("name", desc="user name")
    key = _path("key", desc="access key id")
    toggle = {"enable": "enable an access key", "disable": "disable an access key"}
    paths: dict[str, Schema] = {
        "/v1/users": {
            "get": _op("list users", {200: ("the users", _obj(
                {"users": {"type": "array", "items": _ref("User")}}, ("users",)))},
                tag="users"),
            "post": _op("add a user", {201: ("the user", _ref("User"))}, errors=(409,),
                        body=_ref("NewUser"), tag="users")},
        "/v1/users/{name}": {
            "get": _op("a user and its keys", {200: ("the user", _ref("User"))},
                       errors=(404,), params=[name], tag="users"),
            "delete": _op("remove a user and its keys (never its files)", {200: (
                "what was removed", _obj({"deleted": _STR, "keys_removed": {
                    "type": "array", "items": _STR}}, ("deleted", "keys_removed")))},
                errors=(404, 409), params=[name], tag="users")},
        "/v1/keys": {
            "get": _op("list access keys (never secrets)", {200: ("the keys", _obj(
                {"keys": {"type": "array", "items": _ref("Key")}}, ("keys",)))},
                errors=(404,), params=[_query("user", desc="only this user's keys")],
                tag="users"),
            "post": _op("add an access key: the only answer with its secret", {201: (
                "the key and its secret", {"allOf": [_ref("Key"), _obj(
                    {"secret": _STR}, ("secret",))]})}, errors=(404, 409),
                body=_ref("NewKey"), tag="users")},
        "/v1/keys/{key}": {
            "delete": _op("remove an access key", {200: ("removed", _obj(
                {"deleted": _STR, "user": _STR}, ("deleted", "user")))},
                errors=(404,), params=[key], tag="users")},
    }
    for action, summary in toggle.items():
        paths[f"/v1/keys/{{key}}/{action}"] = {"post": _op(
            summary, {200: ("the key", _ref("Key"))}, errors=(404,), params=[key],
            tag="users")}
    return paths


def _placement() -> dict[str, Schema]:
    prefix_body = _obj({"prefix": _PREFIX})
    pol = ("the prefix's policy", _ref("PlacementPolicy"))
    return {
        "/v1/tiers": {"get": _op("tiers: capacity, use, dirty bytes, read hits", {200: (
            "every tier", _ref("Tiers"))}, errors=(503,), tag="placement")},
        "/v1/placement/du": {"get": _op("bytes under a prefix per tier", {200: (
            "usage", _ref("Du"))}, errors=(404, 503), params=[_query("prefix", _PREFIX)],
            tag="placement")},
        "/v1/placement/ls": {"get": _op(
            "where each file under a prefix is: bytes per tier, state, policy (the first "
            "`limit` files the walk meets, sorted by key)", {200: ("the files", _ref("Ls"))},
            errors=(404, 503), params=[_query("prefix", _PREFIX), _query(
                "limit", {"type": "integer", "minimum": 1, "maximum": 100_000},
                "at most this many files (default 1000)")], tag="placement")},
        "/v1/placement/evict": {"post": _op("evict clean blocks now (synchronous; see "
                                            "/v1/jobs)", {200: ("freed", _ref("Evicted"))},
                                            errors=(404, 503), body_required=False,
                                            body=_obj({"prefix": _PREFIX, "tier": _STR}),
                                            tag="placement")},
        "/v1/placement/pin": {"post": _op("pin a prefix", {200: pol}, errors=(404, 503),
                                          body=prefix_body, body_required=False,
                                          tag="placement")},
        "/v1/placement/unpin": {"post": _op("unpin a prefix", {200: pol}, errors=(503,),
                                            body=prefix_body, body_required=False,
                                            tag="placement")},
        "/v1/placement/policy": {
            "get": _op("every placement policy", {200: ("the policies", _obj(
                {"policies": {"type": "array", "items": _ref("PlacementPolicy")}},
                ("policies",)))}, errors=(503,), tag="placement"),
            "put": _op("set a prefix's policy (fields left out stay)", {200: pol},
                       errors=(404, 503), body_required=False, body=_obj({
                           "prefix": _PREFIX, "mode": _STR, "pin": _BOOL, "tier": _TIER}),
                       tag="placement"),
            "delete": _op("remove a prefix's policy", {200: ("removed", _obj(
                {"prefix": _STR, "deleted": _BOOL}, ("prefix", "deleted")))},
                errors=(404, 503), params=[_query("prefix", _PREFIX)], tag="placement")},
        "/v1/placement/persist": {"post": _op(
            "wait until cold has every change under a prefix (synchronous)", {200: (
                "persisted: false after the timeout", _obj({"prefix": _STR,
                                                            "persisted": _BOOL},
                                                           ("prefix", "persisted")))},
            errors=(404, 503), body_required=False, body=_obj(
                {"prefix": _PREFIX, "timeout": {"type": "number", "minimum": 0,
                                                "maximum": 1e9}}),
            tag="placement")},
        "/v1/placement/import": {"post": _op("list a cold prefix into the namespace", {200: (
            "imported entries", _obj({"prefix": _STR, "imported": _INT},
                                     ("prefix", "imported")))}, errors=(404, 503),
            body=prefix_body, body_required=False, tag="placement")},
        "/v1/placement/warmup": {"post": _op(
            "warm a prefix up, streaming progress (one JSON document per line)",
            {200: ("progress lines {done, total, files, tier, bytes_per_s}; an error line "
                   "{error, message} if the cold store fails", None)}, errors=(404, 503),
            body_required=False, body=_obj({"prefix": _PREFIX, "tier": _TIER}),
            ctype="application/x-ndjson", tag="placement")},
        "/v1/jobs": {
            "get": _op("jobs, newest first", {200: ("the jobs", _obj(
                {"jobs": {"type": "array", "items": _ref("Job")}}, ("jobs",)))},
                params=[_query("state", {"type": "string", "enum": [
                    "queued", "running", "done", "failed", "cancelled"]})], tag="jobs"),
            "post": _op("start a warmup, pin, evict or persist job", {202: (
                "the job, queued or running (Location: /v1/jobs/{id})", _ref("Job"))},
                errors=(404, 429, 503), body=_ref("NewJob"), tag="jobs")},
        "/v1/jobs/{id}": {
            "get": _op("a job and its progress", {200: ("the job", _ref("Job"))},
                       errors=(404,), params=[_path("id")], tag="jobs"),
            "delete": _op("cancel a job (between files; a no-op once finished)", {200: (
                "the job once stopped", _ref("Job"))}, errors=(404,), params=[_path("id")],
                tag="jobs")},
    }


def _pool() -> dict[str, Schema]:
    return {
        "/v1/pool": {"get": _op("the memory pool", {200: ("status", _ref("PoolStatus"))},
                                errors=(503,), tag="pool")},
        "/v1/pool/quota/{tenant}": {"put": _op(
            "set a tenant's pool quota (0 removes it)", {200: ("the tenant", _obj(
                {"tenant": _INT, "quota": _n(_INT), "used": _INT}, ("tenant", "used")))},
            errors=(503,), params=[_path("tenant", _NN_INT, "tenant (uid)")],
            body=_obj({"bytes": _NN_INT}, ("bytes",)), tag="pool")},
        "/v1/pool/regions/{rid}": {"delete": _op(
            "free a pool region", {200: ("freed", _obj(
                {"freed": _INT, "tenant": _INT, "size": _INT}, ("freed", "tenant", "size")))},
            errors=(404, 409, 503), params=[_path("rid", _NN_INT, "region id")],
            tag="pool")},
        "/v1/ckpt": {
            "get": _op("every checkpoint run with its steps (of one bucket with bucket=), or "
                       "one run's steps (with run=)", {200: (
                           "{bucket, runs: [...]} or {bucket, run, steps, keep_local, "
                           "keep_cold}", _ANY_OBJ)},
                       errors=(404, 503), params=[_query("bucket"), _query("run")],
                       tag="pool"),
            "delete": _op("remove a checkpoint step", {200: ("removed", _obj(
                {"bucket": _STR, "run": _STR, "deleted": _INT},
                ("bucket", "run", "deleted")))}, errors=(404, 409, 503),
                params=[_query("bucket", desc="default: checkpoints"), _query("run"),
                        _query("step", _NN_INT)], tag="pool")},
    }


def _buckets() -> dict[str, Schema]:
    name = _path("name", desc="bucket name")
    answer = ("the policy", _ref("BucketPolicy"))
    return {
        "/v1/buckets": {
            "get": _op("every bucket", {200: ("the buckets", _obj(
                {"buckets": {"type": "array", "items": _ref("Bucket")}}, ("buckets",)))},
                errors=(503,), tag="buckets"),
            "post": _op("create a bucket (S3 naming rules)", {201: (
                "the bucket", _ref("Bucket"))}, errors=(404, 409, 503),
                body=_ref("NewBucket"), tag="buckets")},
        "/v1/buckets/{name}": {
            "get": _op("a bucket", {200: ("the bucket", _ref("Bucket"))},
                       errors=(404, 503), params=[name], tag="buckets"),
            "delete": _op("remove an empty bucket", {200: ("removed", _obj(
                {"bucket": _STR, "deleted": _BOOL}, ("bucket", "deleted")))},
                errors=(404, 409, 503), params=[name], tag="buckets")},
        "/v1/buckets/{name}/policy": {
            "get": _op("a bucket's policy", {200: answer}, errors=(404, 503), params=[name],
                       tag="buckets"),
            "put": _op("set a bucket's policy (validated as S3 PutBucketPolicy does)",
                       {200: answer}, errors=(404, 503), params=[name],
                       body=_ref("S3Policy"), tag="buckets"),
            "delete": _op("remove a bucket's policy", {200: ("deleted: whether it had one",
                                                             _obj({"bucket": _STR,
                                                                   "deleted": _BOOL},
                                                                  ("bucket", "deleted")))},
                          errors=(404, 503), params=[name], tag="buckets")},
    }


def _paths() -> dict[str, Schema]:
    return {
        "/healthz": {"get": {"summary": "liveness (no token)", "tags": ["daemon"],
                             "security": [], "responses": {"200": {
                                 "description": "ok", "content": {"text/plain": {
                                     "schema": {"type": "string"}}}}}}},
        "/metrics": {"get": _op("Prometheus metrics (text exposition format)", {200: (
            "the metrics", None)}, ctype="text/plain", tag="daemon")},
        "/v1/status": {"get": _op("the daemon at a glance", {200: ("status", _ref("Status"))},
                                  tag="daemon")},
        "/v1/mounts": {
            "get": _op("the daemon's FUSE mount, if any", {200: ("mounts", _ref("Mounts"))},
                       tag="daemon"),
            "post": _op("mount the namespace at an existing empty directory (one mount per "
                        "daemon)", {201: ("the mount", _obj(
                            {"door": _STR, "mountpoint": _STR, "source": _STR},
                            ("door", "mountpoint")))}, errors=(409, 503),
                        body=_obj({"mountpoint": {"type": "string",
                                                  "description": "an absolute path"}},
                                  ("mountpoint",), additionalProperties=False),
                        tag="daemon"),
            "delete": _op("unmount (a mount in use is detached)", {200: ("unmounted", _obj(
                {"mountpoint": _STR, "unmounted": _BOOL}, ("mountpoint", "unmounted")))},
                errors=(404,), params=[{**_query("mountpoint"), "required": True}],
                tag="daemon")},
        "/v1/openapi.json": {"get": _op("this document", {200: ("OpenAPI 3.1", _ANY_OBJ)},
                                        tag="daemon")},
        **_placement(), **_buckets(), **_users(), **_pool(),
    }


DOCUMENT: Schema = {
    "openapi": "3.1.0",
    "info": {"title": "tierd admin API", "version": __version__,
             "description": "Operators' API of tierd (docs/admin-api.md). Every endpoint "
             "but /healthz needs 'Authorization: Bearer <token>' (DATA_DIR/admin-token) or "
             "an admin user's SigV4 signature. Errors are JSON {error, message}."},
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}],
    "tags": [{"name": t} for t in ("daemon", "placement", "jobs", "buckets", "users",
                                    "pool")],
    "paths": _paths(),
    "components": {"schemas": SCHEMAS, "securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "the admin token (DATA_DIR/admin-token)"}}},
}

_PARAM = re.compile(r"\{[^}]+\}")


def _routes(app: web.Application) -> list[tuple[str, Any]]:
    """(method, resource) of every registered route but HEAD, aiohttp's catch-alls and the
    status page's HTML routes (:mod:`tierd.admin.page`: for browsers, not the JSON API)."""
    from tierd.admin.page import PAGE_PATHS

    return [(r.method.lower(), r.resource) for r in app.router.routes()
            if r.method.lower() in _METHODS and r.resource is not None
            and r.resource.canonical not in PAGE_PATHS]


def _matches(resource: Any, path: str) -> bool:
    info = resource.get_info()
    if "pattern" in info:
        return bool(info["pattern"].fullmatch(path))
    return bool(info.get("path") == path)


def _sample(path: str) -> str:
    """A concrete path for a documented template (``{x}`` becomes ``x0``)."""
    return _PARAM.sub(lambda m: m.group(0)[1:-1] + "0", path)


def documented(app: web.Application) -> list[tuple[str, str]]:
    """(method, path template) of the document's operations the app has a route for."""
    routes = _routes(app)
    return [(m, p) for p, ops in DOCUMENT["paths"].items() for m in ops if m in _METHODS
            and any(rm == m and _matches(res, _sample(p)) for rm, res in routes)]


def unregistered(app: web.Application) -> list[tuple[str, str]]:
    """Documented operations without a route in ``app``."""
    have = set(documented(app))
    return [(m, p) for p, ops in DOCUMENT["paths"].items() for m in ops
            if m in _METHODS and (m, p) not in have]


def undocumented(app: web.Application) -> list[tuple[str, str]]:
    """Routes of ``app`` that no documented operation reaches."""
    samples = [(m, _sample(p)) for p, ops in DOCUMENT["paths"].items() for m in ops]
    out = []
    for m, res in _routes(app):
        if not any(sm == m and _matches(res, sp) for sm, sp in samples):
            out.append((m, res.canonical))
    return out


def served(app: web.Application) -> Schema:
    """The document as this app serves it: only the operations it has routes for."""
    doc = copy.deepcopy(DOCUMENT)
    keep = set(documented(app))
    paths: dict[str, Schema] = {}
    for p, ops in doc["paths"].items():
        kept = {m: op for m, op in ops.items() if (m, p) in keep}
        if kept:
            paths[p] = kept
    doc["paths"] = paths
    return doc


routes = web.RouteTableDef()
#: the document as this app serves it, made at start-up (the routes are all there by then)
_SERVED: web.AppKey[Schema] = web.AppKey("tierd.admin.openapi")


async def prepare(app: web.Application) -> None:
    """At start-up, once every route is added: the document :func:`openapi` answers."""
    app[_SERVED] = served(app)


@routes.get("/v1/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[_SERVED])
