"""The bucket-policy half of every S3 decision: where policies are kept, and what a decision
does to the identity the namespace sees.

The S3 door describes each request (who, which action, which bucket and key, the condition
keys: source address, prefix, ...) and calls :func:`authorize` before touching the
namespace.  An explicit Deny raises :class:`~tierd.acl.AccessDenied` (EACCES, answered 403
AccessDenied) at once.  An Allow returns the identity with a :class:`~tierd.acl.identity.Grant`,
so the namespace's own checks (:func:`tierd.acl.may_access`) pass for that one request even
where modes and ACLs would refuse -- the namespace stays the one place where the operation's
semantics (parents, sticky bits, key/path rules) are applied.  With no applicable statement,
the identity goes on unchanged and POSIX decides.  An anonymous request has no POSIX
identity: POSIX can let it read, write, delete and list only through the anonymous grants
of the inodes on its way (the ``public-read``/``public-read-write`` canned ACLs,
:func:`tierd.acl.modes.anonymous_bits`), so any other action (ACLs, policies, locations,
...) is refused here unless a policy allows it.

A bucket's public access block (:class:`PublicAccessBlock`) reaches the same decision:
where its IgnorePublicAcls or RestrictPublicBuckets flag is on, :meth:`PolicyStore.lookup`
hands out a :class:`GuardedPolicy`, whose evaluation denies anonymous requesters what the
flags take away, so no path that decides with the bucket's policy can miss the block.

Policies live in the bucket's metadata record (:attr:`tierd.meta.Bucket.policy`, the JSON
exactly as it was PUT), so they go with the bucket: deleting a bucket deletes its policy.
They are parsed once per text and cached.
"""

from __future__ import annotations

import errno
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from tierd.acl.identity import Grant, Identity
from tierd.acl.modes import R_OK, W_OK, X_OK, AccessDenied
from tierd.acl.policy import Decision, MalformedPolicy, Policy, Request, Requester, parse_policy
from tierd.errors import FsError
from tierd.meta import Bucket, MetaStore

#: what an Allow grants: every permission the request's namespace operation checks (the
#: operation is the action's own, so this is exactly what the action needs)
GRANT_MASK = R_OK | W_OK | X_OK
_CACHE_MAX = 256
#: what an anonymous request may do without a policy: the actions whose POSIX checks an
#: inode's anonymous grant can pass (the namespace judges them like any other request)
ANONYMOUS_POSIX = frozenset({
    "s3:GetObject", "s3:GetObjectVersion", "s3:PutObject", "s3:DeleteObject",
    "s3:DeleteObjectVersion", "s3:ListBucket",
    "s3:ListBucketVersions", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"})


#: the bucket_config name of the public access block (tierd.s3.bucket_controls writes it)
PAB_CONFIG = "publicAccessBlock"


@dataclass(frozen=True, slots=True)
class PublicAccessBlock:
    """A bucket's PublicAccessBlockConfiguration.  ``block_public_acls`` and
    ``block_public_policy`` refuse writes (the S3 door checks them); the other two change
    decisions, through :class:`GuardedPolicy`: ``ignore_public_acls`` -- anonymous
    requests get nothing from anonymous grants (the ``AllUsers`` ACLs), only what a policy
    allows; ``restrict_public_buckets`` -- while the policy is public, anonymous requests
    get nothing at all (every signed user is a principal of this server, as AWS's "same
    account")."""

    block_public_acls: bool = False
    ignore_public_acls: bool = False
    block_public_policy: bool = False
    restrict_public_buckets: bool = False

    #: the XML element names, in the order of the fields
    NAMES: ClassVar[tuple[str, ...]] = ("BlockPublicAcls", "IgnorePublicAcls",
                                        "BlockPublicPolicy", "RestrictPublicBuckets")

    def flags(self) -> dict[str, bool]:
        return dict(zip(self.NAMES, (self.block_public_acls, self.ignore_public_acls,
                                     self.block_public_policy, self.restrict_public_buckets),
                        strict=True))

    def to_text(self) -> str:
        return json.dumps(self.flags(), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> PublicAccessBlock:
        """The stored form (:meth:`to_text`); a damaged record blocks everything (never
        opens a bucket its owner closed).  Parsed once per text: read on every request to
        a bucket that has one."""
        return _parse_block(text)


@functools.lru_cache(maxsize=256)
def _parse_block(text: str) -> PublicAccessBlock:
    try:
        doc = json.loads(text)
        return PublicAccessBlock(*(doc.get(n) is True for n in PublicAccessBlock.NAMES))
    except (ValueError, AttributeError):
        return PublicAccessBlock(True, True, True, True)


@dataclass(frozen=True, slots=True)
class GuardedPolicy(Policy):
    """A bucket's policy (``stated`` False: it has none, only the statements-less
    placeholder) under its public access block, which :meth:`evaluate` applies to
    anonymous requesters: a Deny (Sid ``PublicAccessBlock:<flag>``) where the block takes
    away what the policy or the anonymous grants would give."""

    block: PublicAccessBlock = PublicAccessBlock()
    stated: bool = True

    def evaluate(self, req: Request) -> tuple[Decision, str]:
        decision, sid = Policy.evaluate(self, req)
        if not req.requester.anonymous or decision is Decision.DENY:
            return decision, sid
        if self.block.restrict_public_buckets and self.public:
            return Decision.DENY, GUARD_SID + "RestrictPublicBuckets"
        if self.block.ignore_public_acls and decision is Decision.NONE:
            return Decision.DENY, GUARD_SID + "IgnorePublicAcls"
        return decision, sid


GUARD_SID = "PublicAccessBlock:"


class PolicyStore:
    """Bucket policies in the metadata store, parsed once per text (one lmdb read per
    request, like the key lookup)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._parsed: dict[tuple[str, str], Policy] = {}

    def get(self, bucket: str) -> Policy | None:
        """The bucket's policy; None when it has none or does not exist."""
        return self.lookup(bucket)[1]

    def lookup(self, bucket: str, guarded: bool = True) -> tuple[bool, Policy | None]:
        """(whether the bucket exists, its policy or None), with one read.  ``guarded``:
        under a public access block that changes decisions, a :class:`GuardedPolicy` (also
        for a bucket without a policy), so every decision made with it obeys the block."""
        with self.meta.snapshot() as tx:
            b = tx.get_bucket(bucket)
        return self.decide(bucket, b, guarded)

    async def aread(self, bucket: str) -> Bucket | None:
        """The bucket's record, read by a coroutine (the S3 door, once per request: it
        holds the policy and the bucket's settings, :meth:`decide`)."""
        async with self.meta.asnapshot() as tx:
            return tx.get_bucket(bucket)

    def decide(self, bucket: str, b: Bucket | None, guarded: bool = True
               ) -> tuple[bool, Policy | None]:
        """:meth:`lookup` from the bucket's record ``b`` already read (None: no bucket)."""
        if b is None:
            return False, None
        policy = self._parsed_policy(bucket, b.policy) if b.policy else None
        block_text = b.config.get(PAB_CONFIG) if guarded else None
        if block_text is None:
            return True, policy
        block = PublicAccessBlock.from_text(block_text)
        if not (block.ignore_public_acls or block.restrict_public_buckets):
            return True, policy
        return True, GuardedPolicy(
            policy.text if policy else "", bucket, policy.version if policy else "",
            policy.statements if policy else (), block=block, stated=policy is not None)

    def block(self, bucket: str) -> PublicAccessBlock:
        """The bucket's public access block (all off without one or without the bucket)."""
        with self.meta.snapshot() as tx:
            b = tx.get_bucket(bucket)
        text = b.config.get(PAB_CONFIG) if b is not None else None
        return PublicAccessBlock.from_text(text) if text else PublicAccessBlock()

    def _parsed_policy(self, bucket: str, text: str) -> Policy:
        ck = (bucket, text)
        policy = self._parsed.get(ck)
        if policy is None:
            try:
                policy = parse_policy(text, bucket)
            except MalformedPolicy:
                # only a policy validated by this module is ever stored; a record damaged
                # by hand must not open the bucket: deny everything to everyone but root
                policy = parse_policy('{"Statement":{"Effect":"Deny","Principal":"*",'
                                      '"NotAction":"s3:ListAllMyBuckets","Resource":"*"}}',
                                      bucket)
            if len(self._parsed) >= _CACHE_MAX:
                self._parsed.clear()
            self._parsed[ck] = policy
        return policy

    async def put(self, bucket: str, policy: Policy) -> None:
        """Store ``policy`` (already validated for ``bucket``); ENOENT when the bucket does
        not exist.  Durable when this returns."""
        async with self.meta.awrite() as tx:
            b = tx.get_bucket(bucket)
            if b is None:
                raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
            b.policy = policy.text
            tx.put_bucket(b)
        await self.meta.flush()

    async def delete(self, bucket: str) -> bool:
        """Remove the bucket's policy; False when it had none.  ENOENT without the bucket."""
        async with self.meta.awrite() as tx:
            b = tx.get_bucket(bucket)
            if b is None:
                raise FsError(errno.ENOENT, f"bucket {bucket!r} does not exist")
            had = bool(b.policy)
            if had:
                b.policy = ""
                tx.put_bucket(b)
        if had:
            await self.meta.flush()
        return had


def decide(policy: Policy | None, requester: Requester, action: str, bucket: str,
           key: str | None, context: Mapping[str, str]) -> tuple[Decision, str]:
    """The policy's decision (and deciding Sid) for one request; NONE without a policy."""
    if policy is None:
        return Decision.NONE, ""
    return policy.evaluate(Request(requester, action, bucket, key, context))


def authorize(policy: Policy | None, ident: Identity, requester: Requester, action: str,
              bucket: str, key: str | None, context: Mapping[str, str]) -> Identity:
    """The identity the namespace must see for this request (module doc), or
    :class:`~tierd.acl.AccessDenied`.  A Deny binds root too, as it binds an AWS account's
    root user; the policy operations themselves are the owner's and root's whatever the
    policy says (the door checks them), so a policy that locks everyone out can be fixed."""
    decision, sid = decide(policy, requester, action, bucket, key, context)
    where = f"{bucket}/{key}" if key is not None else bucket
    if decision is Decision.DENY and sid.startswith(GUARD_SID):
        raise AccessDenied(errno.EACCES, f"anonymous {action} on {where!r} is refused by the "
                           f"bucket's public access block ({sid.removeprefix(GUARD_SID)})")
    if decision is Decision.DENY:
        by = f" (statement {sid!r})" if sid else ""
        raise AccessDenied(errno.EACCES, f"{action} on {where!r} is denied by the bucket "
                           f"policy{by}")
    if decision is Decision.ALLOW:
        return Identity(ident.uid, ident.gid, ident.groups, Grant(GRANT_MASK), ident.anonymous)
    if ident.anonymous and action not in ANONYMOUS_POSIX:
        raise AccessDenied(errno.EACCES, f"anonymous {action} on {where!r}: no bucket policy "
                           "allows it; sign the request with an access key")
    return ident
