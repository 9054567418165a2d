"""Admin endpoints of buckets and bucket policies (``tierctl bucket ...``).

* ``GET /v1/buckets`` -- ``{"buckets": [bucket, ...]}`` by name; a bucket is ``{name,
  owner_uid, owner, created_ns, created, region, acl, policy, public}`` (``owner`` is the
  user name of ``owner_uid`` when a user has it, ``acl`` the canned ACL its directory's
  access amounts to now, or ``custom`` (:func:`bucket_doc`), ``policy`` whether it has
  one, ``public`` whether anonymous requests get something: an unconditional policy Allow
  for everyone, or a public-read(-write) anonymous grant).  Object counts and bytes
  are not here: counting walks the bucket, which ``GET /v1/placement/du?prefix=NAME/``
  does on request;
* ``POST /v1/buckets`` ``{"name", "owner"?}`` -- create a bucket (``201`` with the bucket),
  owned by the user named ``owner`` (its uid, gid and groups, as if that user's S3 key had
  created it) or by root; the S3 naming rules apply (``400 invalid_bucket_name``), an
  existing name is ``409 bucket_exists``, an unknown user ``404 no_such_user``;
* ``GET /v1/buckets/{name}`` -- one bucket;
* ``DELETE /v1/buckets/{name}`` -- remove an empty bucket (``{"bucket", "deleted": true}``;
  ``409 bucket_not_empty`` otherwise: objects are removed through S3 or the mount, never in
  bulk by an admin call);
* ``GET /v1/buckets/{name}/policy`` -- ``{"bucket", "policy": {...}, "public"}``;
* ``PUT /v1/buckets/{name}/policy`` -- the body is the policy document itself, as for S3's
  PutBucketPolicy; answers like GET;
* ``DELETE /v1/buckets/{name}/policy`` -- ``{"bucket", "deleted": true|false}``.

These are the S3 door's policies, not a copy: validation is
:func:`tierd.acl.policy.parse_policy` (what PutBucketPolicy calls, with the same messages) and
storage is :class:`tierd.acl.authorize.PolicyStore` (the JSON in the bucket's metadata
record), so a policy put here is enforced by the next S3 request.  The admin token manages
every bucket's policy, as root or an admin user does through S3.

Buckets are made and removed by the namespace (:meth:`~tierd.namespace.Namespace.create_bucket`),
the same call as S3's CreateBucket/DeleteBucket, so the mount and the S3 door see the change at
once.

Errors: 400 ``malformed_policy``, 404 ``no_such_bucket`` / ``no_such_policy``.
"""

from __future__ import annotations

import errno
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tierd.acl import Identity, canned
from tierd.acl.authorize import PolicyStore
from tierd.acl.modes import anonymous_bits
from tierd.acl.policy import MalformedPolicy, parse_policy
from tierd.acl.users import Directory, DirectoryError
from tierd.admin.auth import identity
from tierd.admin.backend import BACKEND, ready
from tierd.admin.backend import json_error as _err
from tierd.errors import FsError
from tierd.logs import get_logger, kv
from tierd.meta import Bucket, Inode, MetaStore

if TYPE_CHECKING:
    from tierd.namespace.api import NamespaceAPI

log = get_logger("admin")

def _no_bucket(name: str) -> web.Response:
    return _err(404, "no_such_bucket", f"no such bucket {name!r}")


def _fs_refused(e: FsError) -> web.Response:
    """A namespace refusal other than the expected ones (permission, full disk ...)."""
    if e.errno in (errno.EACCES, errno.EPERM):
        return _err(403, "forbidden", e.message)
    return _err(409 if e.errno == errno.EBUSY else 503, "refused", e.message)


def bucket_doc(b: Bucket, inode: Inode | None, store: PolicyStore,
               owners: dict[int, str]) -> dict[str, Any]:
    """A bucket as the API shows it.  ``acl`` is the access its directory ``inode`` (None:
    removed meanwhile) really gives now -- the canned ACL its mode bits, ACL and anonymous
    grant amount to, or ``custom`` -- however it was set (CreateBucket, PutBucketAcl, chmod
    or setfacl on the mount), never a label kept from creation; ``public``: anonymous
    requests get something, through the policy or the anonymous grant."""
    policy = store.lookup(b.name, guarded=False)[1] if b.policy else None
    access = canned.describe(inode, b.owner_uid) if inode is not None else "custom"
    anonymous = inode is not None and bool(anonymous_bits(inode))
    return {
        "name": b.name, "owner_uid": b.owner_uid, "owner": owners.get(b.owner_uid),
        "created_ns": b.created_ns,
        "created": datetime.fromtimestamp(b.created_ns / 1e9, UTC).isoformat(
            timespec="seconds").replace("+00:00", "Z"),
        "region": b.region, "acl": access, "policy": bool(b.policy),
        "public": (policy is not None and policy.public) or anonymous,
    }


routes = web.RouteTableDef()


class PolicyStores:
    """The :class:`PolicyStore` of the daemon's metadata store, made on first use (the
    directory comes up with the daemon) and kept, so policies are parsed once per text."""

    def __init__(self) -> None:
        self._store: PolicyStore | None = None

    def of(self, meta: MetaStore) -> PolicyStore:
        if self._store is None or self._store.meta is not meta:
            self._store = PolicyStore(meta)
        return self._store


#: the application's policy stores
POLICY_STORES: web.AppKey[PolicyStores] = web.AppKey("tierd.admin.buckets.policies")


def _directory(request: web.Request) -> Directory:
    return ready(request.app[BACKEND].directory(), "the metadata store is not ready")


def _namespace(request: web.Request) -> NamespaceAPI:
    return ready(request.app[BACKEND].namespace, "the namespace is not ready")


def _store(request: web.Request) -> PolicyStore:
    return request.app[POLICY_STORES].of(_directory(request).meta)


def _owners(request: web.Request) -> dict[int, str]:
    names: dict[int, str] = {}
    for user, _ in _directory(request).list_users():
        names.setdefault(user.uid, user.name)
    return names


async def _get_bucket(request: web.Request, name: str) -> Bucket | None:
    """The bucket's record, read through the namespace (None: no such bucket)."""
    try:
        return await _namespace(request).get_bucket(name)
    except FsError as e:
        if e.errno == errno.ENOENT:
            return None
        raise


async def _described(request: web.Request, b: Bucket, s: PolicyStore,
                     names: dict[int, str]) -> dict[str, Any]:
    """:func:`bucket_doc` of ``b`` with its directory's inode read through the namespace."""
    try:
        inode: Inode | None = await _namespace(request).getattr(Identity.ROOT, b.ino)
    except FsError as e:
        if e.errno != errno.ENOENT:
            raise
        inode = None
    return bucket_doc(b, inode, s, names)


@routes.get("/v1/buckets")
async def listing(request: web.Request) -> web.Response:
    s = _store(request)
    buckets = await _namespace(request).list_buckets(Identity.ROOT)
    names = _owners(request)
    return web.json_response({"buckets": [await _described(request, b, s, names)
                                          for b in sorted(buckets, key=lambda b: b.name)]})


@routes.post("/v1/buckets")
async def create(request: web.Request) -> web.Response:
    try:
        doc = await request.json()
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        return _err(400, "bad_request", 'the body must be {"name": BUCKET, "owner": USER?}')
    unknown = sorted(set(doc) - {"name", "owner"})
    if unknown:
        return _err(400, "bad_request", f"unknown field {unknown[0]!r} (expected name, "
                    "owner)")
    name, owner = doc["name"], doc.get("owner")
    ident = Identity.ROOT
    if owner is not None:
        try:
            user = _directory(request).get_user(str(owner))
        except DirectoryError as e:
            return _err(404, "no_such_user", f"{e} (tierctl user list shows the users)")
        ident = Identity(user.uid, user.gid, frozenset(user.groups))
    try:
        await _namespace(request).create_bucket(ident, name)
    except FsError as e:
        if e.errno == errno.EEXIST:
            return _err(409, "bucket_exists", f"bucket {name!r} exists already")
        if e.errno == errno.EINVAL:
            return _err(400, "invalid_bucket_name", e.message)
        return _fs_refused(e)
    log.info("bucket created", extra=kv(identity=identity(request), bucket=name,
                                        owner_uid=ident.uid))
    s = _store(request)
    b = await _get_bucket(request, name)
    if b is None:  # removed again in between
        return _no_bucket(name)
    return web.json_response(await _described(request, b, s, _owners(request)), status=201,
                             headers={"Location": f"/v1/buckets/{name}"})


@routes.get("/v1/buckets/{name}")
async def one(request: web.Request) -> web.Response:
    s, name = _store(request), request.match_info["name"]
    b = await _get_bucket(request, name)
    if b is None:
        return _no_bucket(name)
    return web.json_response(await _described(request, b, s, _owners(request)))


@routes.delete("/v1/buckets/{name}")
async def delete(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    try:
        await _namespace(request).delete_bucket(Identity.ROOT, name)
    except FsError as e:
        if e.errno == errno.ENOENT:
            return _no_bucket(name)
        if e.errno == errno.ENOTEMPTY:
            return _err(409, "bucket_not_empty", f"bucket {name!r} is not empty: remove "
                        "its objects first (through S3 or the mount)")
        return _fs_refused(e)
    log.info("bucket deleted", extra=kv(identity=identity(request), bucket=name))
    return web.json_response({"bucket": name, "deleted": True})


def _policy_answer(name: str, s: PolicyStore) -> web.Response:
    policy = s.lookup(name, guarded=False)[1]  # its own, not a public access block's
    if policy is None:
        return _err(404, "no_such_policy", f"bucket {name!r} has no policy")
    return web.json_response({"bucket": name, "policy": json.loads(policy.text),
                              "public": policy.public})


@routes.get("/v1/buckets/{name}/policy")
async def policy_get(request: web.Request) -> web.Response:
    s, name = _store(request), request.match_info["name"]
    if await _get_bucket(request, name) is None:
        return _no_bucket(name)
    return _policy_answer(name, s)


@routes.put("/v1/buckets/{name}/policy")
async def policy_put(request: web.Request) -> web.Response:
    s, name = _store(request), request.match_info["name"]
    raw = await request.read()
    if await _get_bucket(request, name) is None:
        return _no_bucket(name)
    try:
        policy = parse_policy(raw, name)
    except MalformedPolicy as e:
        return _err(400, "malformed_policy", str(e))
    try:
        await s.put(name, policy)
    except FsError:
        return _no_bucket(name)
    log.info("bucket policy set", extra=kv(identity=identity(request), bucket=name,
                                           public=policy.public))
    return _policy_answer(name, s)


@routes.delete("/v1/buckets/{name}/policy")
async def policy_delete(request: web.Request) -> web.Response:
    s, name = _store(request), request.match_info["name"]
    try:
        had = await s.delete(name)
    except FsError:
        return _no_bucket(name)
    log.info("bucket policy deleted", extra=kv(identity=identity(request), bucket=name,
                                               had_policy=had))
    return web.json_response({"bucket": name, "deleted": had})
