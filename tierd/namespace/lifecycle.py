"""Bucket lifecycle rules and the background job that applies them.

S3's lifecycle configuration (PutBucketLifecycleConfiguration, :mod:`tierd.s3.lifecycle`)
is stored, validated, as JSON under the bucket configuration name ``lifecycle``
(:mod:`tierd.namespace.bucketconf`).  This module owns that form (:class:`Rule`, :func:`encode`,
:func:`decode`) and :class:`LifecycleJob`, which every ``lifecycle_interval`` seconds applies
the enabled rules of every bucket:

* **Expiration** (``Days`` or ``Date``): matching current objects are deleted through the
  namespace -- the same delete as DeleteObject, so a versioned bucket gets a delete marker;
* **AbortIncompleteMultipartUpload** (``DaysAfterInitiation``): uploads are aborted;
* **NoncurrentVersionExpiration** (``NoncurrentDays``, ``NewerNoncurrentVersions``) and
  ``ExpiredObjectDeleteMarker``: the versioning namespace's ``expire_noncurrent``
  (:mod:`tierd.namespace.versionops`) removes the versions and markers.

Transitions are refused when the configuration is stored: tierd's placement policies decide
which tier holds data (docs/placement.md).

Days are whole days as AWS counts them: an object of ``Days: n`` expires at the first
midnight (UTC) at least ``n`` days after its last modification, i.e. when
``mtime <= midnight_today - n days``.  The day length is :data:`DAY_ENV` seconds when that
environment variable is set (tests: a day of one second), else 86400.

The job never blocks the loop for long: keys are scanned a page at a time
(:data:`PAGE` keys, the listing every S3 client gets), deletes go in batches of
:data:`BATCH`, and the loop gets a turn between them.  It is safe against concurrent
writers: a key is deleted only if, at the moment of the delete, it is still the object the
scan judged (same inode, content version and modification time, no unflushed writes) --
the check and the namespace's delete run without a suspension point between them, so a key
rewritten after the scan is never deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tierd.acl import Identity
from tierd.errors import FsError
from tierd.namespace.tags import tags_of

if TYPE_CHECKING:
    from tierd.namespace import Namespace

log = logging.getLogger("tierd.lifecycle")

#: the bucket configuration document's name (tierd.namespace.bucketconf)
CONFIG_NAME = "lifecycle"
#: environment variable: seconds in a lifecycle "day" (tests only; default 86400)
DAY_ENV = "TIERD_LIFECYCLE_DAY_SECONDS"
DAY = 86400.0
PAGE = 64  # keys per listing page the job scans (~1 ms of the loop)
BATCH = 16  # keys per namespace delete call (one metadata sync each; a few ms)
#: filter kinds, as the configuration said them (GET gives back the same form)
FILTER_KINDS = ("legacy", "none", "prefix", "tag", "and", "gt", "lt")


@dataclass
class Filter:
    """A rule's filter.  ``kind`` is how it was written: ``legacy`` (the rule's own
    ``<Prefix>``), ``none`` (an empty ``<Filter/>``), ``prefix``, ``tag``, ``gt``/``lt``
    (ObjectSizeGreaterThan/LessThan alone) or ``and``."""

    kind: str = "none"
    prefix: str = ""
    tags: list[tuple[str, str]] = field(default_factory=list)
    gt: int | None = None
    lt: int | None = None

    def matches(self, key: str, size: int, tags: list[tuple[str, str]]) -> bool:
        if not key.startswith(self.prefix):
            return False
        if self.gt is not None and not size > self.gt:
            return False
        if self.lt is not None and not size < self.lt:
            return False
        return all(t in tags for t in self.tags)

    @property
    def prefix_only(self) -> bool:
        return not self.tags and self.gt is None and self.lt is None


@dataclass
class Rule:
    """One ``<Rule>``; None is an element that was not given."""

    id: str
    enabled: bool
    filter: Filter
    days: int | None = None  # Expiration/Days
    date: str | None = None  # Expiration/Date, ISO 8601 at midnight UTC
    expired_marker: bool | None = None  # Expiration/ExpiredObjectDeleteMarker
    noncurrent_days: int | None = None  # NoncurrentVersionExpiration/NoncurrentDays
    newer_noncurrent: int | None = None  # .../NewerNoncurrentVersions
    abort_days: int | None = None  # AbortIncompleteMultipartUpload/DaysAfterInitiation

    @property
    def expires_current(self) -> bool:
        return self.days is not None or self.date is not None

    def date_ns(self) -> int:
        assert self.date is not None
        when = datetime.datetime.fromisoformat(self.date.replace("Z", "+00:00"))
        return int(when.timestamp()) * 1_000_000_000


def encode(rules: list[Rule]) -> str:
    """The stored form: compact JSON without the unset fields (1000 rules fit in the bucket
    configuration's size limit)."""
    out = []
    for r in rules:
        d = {k: v for k, v in asdict(r).items() if v is not None}
        d["filter"] = {k: v for k, v in d["filter"].items() if v not in (None, "", [])}
        out.append(d)
    return json.dumps(out, separators=(",", ":"))


def decode(text: str) -> list[Rule]:
    rules: list[Rule] = []
    for raw in json.loads(text):
        f = raw.pop("filter")
        f["tags"] = [(k, v) for k, v in f.get("tags", [])]
        rules.append(Rule(filter=Filter(**f), **raw))
    return rules


def day_seconds() -> float:
    raw = os.environ.get(DAY_ENV)
    try:
        return float(raw) if raw else DAY
    except ValueError:
        return DAY


def cutoff_ns(now_ns: int, days: int, day: float) -> int:
    """The newest time (ns) whose ``days`` whole days are over by ``now_ns``: AWS rounds an
    object's expiry up to the next midnight UTC, so the object expires once
    ``t <= last midnight - days``."""
    day_ns = int(day * 1e9)
    return (now_ns // day_ns) * day_ns - days * day_ns


@dataclass
class Counts:
    """What one pass did (also the totals since start)."""

    expired: int = 0  # current objects deleted
    aborted: int = 0  # multipart uploads aborted
    noncurrent: int = 0  # noncurrent versions and delete markers removed
    skipped: int = 0  # judged expired but changed before the delete (or upload completed)

    def add(self, other: Counts) -> None:
        self.expired += other.expired
        self.aborted += other.aborted
        self.noncurrent += other.noncurrent
        self.skipped += other.skipped


class LifecycleJob:
    """Applies every bucket's lifecycle rules every ``interval`` seconds (module doc)."""

    def __init__(self, ns: Namespace, interval: float, *,
                 on_action: Callable[[str, int], None] | None = None) -> None:
        self.ns = ns
        self.interval = interval
        #: called with (action, count) after each pass's deletes: the metrics counter
        self.on_action = on_action
        self.totals = Counts()
        self.passes = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lifecycle")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad pass must not end the job
                log.exception("lifecycle pass failed")

    async def run_once(self, now_ns: int | None = None) -> Counts:
        """One pass over every bucket with rules; returns what it did."""
        now = time.time_ns() if now_ns is None else now_ns
        day = day_seconds()
        done = Counts()
        for b in await self.ns.list_buckets(Identity.ROOT):
            text = b.config.get(CONFIG_NAME)
            if not text:
                continue
            for rule in decode(text):
                if rule.enabled:
                    try:
                        done.add(await self._apply(b.name, rule, now, day))
                    except FsError as e:  # the bucket went away meanwhile
                        log.info("lifecycle rule %r of bucket %s: %s", rule.id, b.name, e)
        self.passes += 1
        self.totals.add(done)
        self._report(done)
        return done

    def _report(self, done: Counts) -> None:
        if done.expired or done.aborted or done.noncurrent:
            log.info("lifecycle: expired %d objects, aborted %d uploads, removed %d noncurrent "
                     "versions (%d skipped)", done.expired, done.aborted, done.noncurrent,
                     done.skipped)
        if self.on_action is not None:
            for action, n in (("expire", done.expired), ("abort_upload", done.aborted),
                              ("expire_noncurrent", done.noncurrent),
                              ("skipped", done.skipped)):
                if n:
                    self.on_action(action, n)

    async def _apply(self, bucket: str, rule: Rule, now: int, day: float) -> Counts:
        done = Counts()
        if rule.expires_current:
            limit = (rule.date_ns() if rule.date is not None
                     else cutoff_ns(now, rule.days or 0, day))
            if rule.date is None or now >= limit:
                await self._expire_current(bucket, rule, limit if rule.date is None else now,
                                           done)
        if rule.abort_days is not None:
            await self._abort_uploads(bucket, rule, cutoff_ns(now, rule.abort_days, day), done)
        if rule.noncurrent_days is not None or rule.expired_marker:
            older = (cutoff_ns(now, rule.noncurrent_days, day) + 1
                     if rule.noncurrent_days is not None else 0)
            await self._expire_noncurrent(bucket, rule, older, done)
        return done

    async def _expire_current(self, bucket: str, rule: Rule, newest_ns: int,
                              done: Counts) -> None:
        """Delete the current objects matching ``rule`` last modified at or before
        ``newest_ns``, a page of the listing at a time."""
        after = ""
        while True:
            page = await self.ns.list_objects(Identity.ROOT, bucket, rule.filter.prefix, after,
                                              "", PAGE)
            doomed = [(k, (i.ino, i.version, i.mtime_ns)) for k, i in page.contents
                      if i.is_reg and i.mtime_ns <= newest_ns
                      and rule.filter.matches(k, i.size, tags_of(i))]
            for i in range(0, len(doomed), BATCH):
                await self.expire_batch(bucket, doomed[i:i + BATCH], done)
            if not page.truncated:
                return
            after = page.next_marker
            await asyncio.sleep(0)

    async def expire_batch(self, bucket: str, doomed: list[tuple[str, tuple[int, int, int]]],
                           done: Counts) -> None:
        """Delete the keys of ``doomed`` that are still the objects the scan saw: (inode,
        content version, mtime).  The check and the delete run with no suspension point in
        between (``delete_versions`` deletes before its first wait), so a write cannot come
        in between them."""
        keys = [key for key, seen in doomed if self._unchanged(bucket, key, seen)]
        done.skipped += len(doomed) - len(keys)
        if not keys:
            return
        # DeleteObject's own path: a delete marker in a versioned bucket, else the key goes
        results = await self.ns.delete_versions(Identity.ROOT, bucket,
                                                [(key, None) for key in keys])
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, FsError):
                log.info("lifecycle: cannot expire %s/%s: %s", bucket, key, result)
                done.skipped += 1
            else:
                log.debug("lifecycle: expired %s/%s", bucket, key)
                done.expired += 1

    def _unchanged(self, bucket: str, key: str, seen: tuple[int, int, int]) -> bool:
        """Whether ``key`` is still the object the scan saw, with no unflushed writes."""
        ns = self.ns
        try:
            with ns.meta.snapshot() as tx:
                inode = ns._object(tx, Identity.ROOT, bucket, key)
        except FsError:
            return False
        if ns._open_dirty(inode.ino):
            return False
        inode = ns._live(inode)
        return (inode.ino, inode.version, inode.mtime_ns) == seen

    async def _abort_uploads(self, bucket: str, rule: Rule, newest_ns: int,
                             done: Counts) -> None:
        ups, _ = await self.ns.list_multipart_uploads(Identity.ROOT, bucket, rule.filter.prefix,
                                                      limit=1 << 30)
        for up in ups:
            if up.initiated_ns > newest_ns:
                continue
            try:
                await self.ns.abort_multipart(Identity.ROOT, up.upload_id)
            except FsError:  # completed or aborted meanwhile
                done.skipped += 1
                continue
            log.debug("lifecycle: aborted upload %s of %s/%s", up.upload_id, bucket, up.key)
            done.aborted += 1

    async def _expire_noncurrent(self, bucket: str, rule: Rule, older_than_ns: int,
                                 done: Counts) -> None:
        """NoncurrentVersionExpiration and ExpiredObjectDeleteMarker: the versioning
        namespace's own pass (nothing to do in a bucket never versioned)."""
        if not self.ns.versioning(bucket):
            return
        done.noncurrent += await self.ns.expire_noncurrent(
            bucket, rule.filter.prefix, older_than_ns, keep_newer=rule.newer_noncurrent or 0,
            expired_markers=bool(rule.expired_marker))
