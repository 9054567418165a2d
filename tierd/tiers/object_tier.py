"""The cold tier's interface: a store of whole objects, the system of record.

Placement persists a file by putting its content as one object and fills the hot tier by
reading ranges of it back.  Every engine (``file://`` directory, ``s3://`` through boto3, any
other fsspec URL) implements :class:`ObjectTier`, and the one backend suite in
``tests/tiers/`` runs against all of them, so placement never needs to know which it has.

**Keys** are ``"<bucket>/<key>"``: the namespace's bucket and key joined by ``/``.  The
layout is *transparent*: the object lands at exactly that path under the tier's prefix
(``s3://cold/tierd`` + ``photos/cat.jpg`` -> ``s3://cold/tierd/photos/cat.jpg``), so any S3
client or ``ls`` reads persisted data without tierd, and objects uploaded there by others are
readable through tierd.  Keys must be valid relative paths (see :func:`check_key`); a key
ending in ``/`` (a directory marker) is not an object here: directories are namespace
metadata.

**Errors** are few on purpose, because placement maps them to errnos and S3 codes:

* :class:`ObjectNotFound` (also a ``KeyError``): the key has no object;
* :class:`TierUnavailable`: the store cannot be used now (unreachable, 5xx or throttling after
  the engine's retries, credentials refused, cold bucket missing, local cold disk full):
  EIO/503 for reads of uncached data, a reason to keep dirty data and retry later for writes;
* :class:`ObjectChanged`: an ``if_match`` ETag no longer matches (someone replaced the object);
* :class:`InvalidKey` (also a ``ValueError``), :class:`KeyConflict` (``a`` and ``a/b`` in a
  store that is a file system), :class:`KeyRejected` (the store cannot take this one key: a
  path over its limits): errors of one key, never a reason to think the store is down;
* ``OSError`` only from the *caller's* descriptor (``read_into``'s destination,
  ``put_file``'s source): a full hot tier must reach placement as ENOSPC, not as a cold fault.

**Timeouts and reachability**: a metadata call (``head``, ``list``, ``delete``, ``probe``)
that has not answered within ``call_timeout`` seconds raises :class:`TierUnavailable` (the
S3 engine's HTTP calls also have botocore's connect and read timeouts, so transfers cannot
hang either).  Every call's outcome feeds :class:`Health`: the store is *reachable* while the
last outcome was an answer and no call has waited longer than ``call_timeout`` since the
last answer (:mod:`tierd.tiers.health`).

**Concurrency**: every blocking call (boto3, fsspec, file I/O) runs on the tier's own bounded
thread pools, never on the event loop: one for transfers, a small one for metadata calls
(which must not wait behind transfers for a thread).  Large transfers are split into
ranges/parts run in parallel, at most ``TransferOptions.concurrency`` per operation.  When
an operation that uses a caller's descriptor fails or is cancelled, it waits for its
threads to stop before it raises: a late thread writing into a descriptor the caller has
reused would corrupt data.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import concurrent.futures
import errno
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from tierd.tiers.fileio import pwrite_all
from tierd.tiers.health import Health

T = TypeVar("T")

#: sorts after every character a key can contain: ``p + MAX_CHAR`` is a bound just past every
#: key that starts with ``p`` (used to skip a whole common prefix when listing)
MAX_CHAR = "\U0010ffff"

#: the largest page :meth:`ObjectTier.list` returns (S3's own limit)
MAX_LIST = 1000

# --- errors ---------------------------------------------------------------------------------


class TierError(Exception):
    """Base of every error an object tier raises (besides the caller's own ``OSError``)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key

    def __str__(self) -> str:
        return self.message


class TierUnavailable(TierError):
    """The store cannot serve the request now; retrying later may succeed.

    Placement maps it to EIO (FUSE) / 503 (S3) for reads of uncached data and keeps dirty
    data local until :meth:`ObjectTier.probe` succeeds again."""


class TierThrottled(TierUnavailable):
    """The store answered, asking for fewer requests (S3 ``SlowDown``, HTTP 429): this
    request may be tried again later, and the store itself is up -- its reachability
    (:class:`~tierd.tiers.health.Health`) counts the answer, so a throttled store is not
    reported down and persisting is not paused for every file, only the refused ones
    back off."""


class ObjectNotFound(TierError, KeyError):
    """No object has this key."""

    def __str__(self) -> str:  # KeyError's __str__ would repr() the message
        return self.message


class ObjectChanged(TierError):
    """The object no longer has the ETag the caller asked for with ``if_match``."""


class InvalidKey(TierError, ValueError):
    """The key is not a valid ``<bucket>/<key>`` relative path."""


class KeyRejected(TierError):
    """The store cannot take this key (a path over its limits: too long, too deep, a name
    its file system refuses).  An error of the one file, not of the store: retrying does
    not help until the file is renamed."""


#: errnos of a file-system store that belong to one key (its path), not to the store
KEY_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EILSEQ})


class KeyConflict(TierError):
    """The store is a file system and ``a`` and ``a/b`` cannot both exist.

    Raised by :class:`~tierd.tiers.file_tier.FileObjectTier` when an older object is in the
    way (e.g. a rename whose background delete has not run yet): retry after it is gone."""


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What the store knows about one object.

    ``etag`` is the *store's* identity of the content (quotes stripped): compare it with an
    earlier value of the same store to detect change; it need not equal the namespace's ETag
    (a ``file://`` store without xattrs, or a multipart upload with another part size,
    differ).  ``mtime_ns`` is the store's modification time (S3: second resolution)."""

    key: str
    size: int
    etag: str
    mtime_ns: int


class ListPage(NamedTuple):
    """One page of :meth:`ObjectTier.list`, in key order (UTF-8 byte order)."""

    objects: list[ObjectInfo]
    common_prefixes: list[str]
    truncated: bool

    @property
    def next_start_after(self) -> str:
        """What to pass as ``start_after`` for the next page ("" when the page is empty)."""
        last_obj = self.objects[-1].key if self.objects else ""
        last_cp = self.common_prefixes[-1] if self.common_prefixes else ""
        return max(last_obj, last_cp)


@dataclass(frozen=True, slots=True)
class TransferOptions:
    """How large transfers are split; shared by every engine.

    Defaults suit a LAN object store; tests lower them to exercise multipart with small data.
    """

    #: ``put_file`` of at least this many bytes uses a multipart upload (and ``copy`` a
    #: multipart copy); below it, one PUT
    multipart_threshold: int = 64 << 20
    #: size of each multipart part (raised automatically to stay within 10,000 parts)
    part_size: int = 16 << 20
    #: size of each ranged GET when ``read_into``/``get_range`` fetch in parallel
    range_size: int = 8 << 20
    #: parallel parts / ranged GETs per operation; the thread pool and (S3) the HTTP
    #: connection pool are sized from it
    concurrency: int = 16

    def __post_init__(self) -> None:
        for name in ("multipart_threshold", "part_size", "range_size", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")


# --- keys -----------------------------------------------------------------------------------


def each_key(keys: Sequence[str], fn: Callable[[str], object]) -> dict[str, TierError | None]:
    """``fn(key)`` for each of ``keys`` that :func:`check_key` passes: each key's outcome,
    None, or the :class:`TierError` it (or the check) raised -- a bulk call's answer made
    one key at a time (``delete_many`` of the engines without a bulk request)."""
    out: dict[str, TierError | None] = {}
    for key in keys:
        try:
            fn(check_key(key))
        except TierError as e:
            out[key] = e
        else:
            out[key] = None
    return out


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid ``<bucket>/<key>``, else raise :class:`InvalidKey`.

    The rules make every key a safe relative path (so a ``file://`` store cannot be escaped
    through ``..``) and mirror the namespace's key rules: no empty, ``.`` or ``..`` segment,
    no NUL, segments of at most 255 bytes, a bucket segment not starting with ``.`` (names
    starting with ``.`` are the stores' own housekeeping) and at least one key segment.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKey("empty object key", key=key)
    if "\x00" in key:
        raise InvalidKey(f"object key {key!r} contains NUL", key=key)
    try:
        key.encode()
    except UnicodeEncodeError:
        raise InvalidKey(f"object key {key!r} is not valid UTF-8", key=key) from None
    parts = key.split("/")
    if len(parts) < 2:
        raise InvalidKey(f"object key {key!r} is not <bucket>/<key>", key=key)
    if key.endswith("/"):
        raise InvalidKey(f"object key {key!r} is a directory marker, not an object", key=key)
    for p in parts:
        if p in ("", ".", ".."):
            raise InvalidKey(f"object key {key!r} has an empty, '.' or '..' segment", key=key)
        if len(p.encode()) > 255:
            raise InvalidKey(f"object key {key!r} has a segment over 255 bytes", key=key)
    if parts[0].startswith("."):
        raise InvalidKey(f"bucket {parts[0]!r} of key {key!r} starts with '.'", key=key)
    return key


def check_list_args(prefix: str, delimiter: str, limit: int) -> None:
    """Validate :meth:`ObjectTier.list` arguments (the same way in every engine)."""
    if "\x00" in prefix or "\x00" in delimiter:
        raise InvalidKey("listing prefix or delimiter contains NUL", key=prefix)
    if prefix.startswith("/"):
        raise InvalidKey(f"listing prefix {prefix!r} starts with '/'", key=prefix)
    if not 1 <= limit <= MAX_LIST:
        raise ValueError(f"list limit {limit} is out of range 1-{MAX_LIST}")


def list_lower_bound(prefix: str, start_after: str, delimiter: str) -> str:
    """The exclusive lower bound of a listing's keys.

    A ``start_after`` that is a common prefix (ends with the delimiter, inside the listing's
    prefix) skips everything under it; otherwise the next page would roll the keys below it
    up into the same common prefix again."""
    if (
        delimiter
        and start_after.endswith(delimiter)
        and start_after.startswith(prefix)
        and len(start_after) > len(prefix)
    ):
        return start_after + MAX_CHAR
    return start_after


class DestinationError(Exception):
    """An ``OSError`` writing the caller's descriptor (e.g. ENOSPC on the hot tier): passed
    through as is by :meth:`ObjectTier._fill`, never turned into a cold-store fault."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def write_dest(dst: int, data: bytes, pos: int) -> None:
    """Write all of ``data`` at ``pos`` of the caller's descriptor (blocking)."""
    try:
        pwrite_all(dst, data, pos)
    except OSError as e:
        raise DestinationError(e) from None


def split_ranges(offset: int, length: int, chunk: int) -> list[tuple[int, int]]:
    """``[offset, offset+length)`` as ``(offset, length)`` pieces of at most ``chunk`` bytes."""
    return [(o, min(chunk, offset + length - o)) for o in range(offset, offset + length, chunk)]


def check_range(offset: int, length: int) -> None:
    """Reject a negative offset or length (a caller's bug, not a store fault)."""
    if offset < 0 or length < 0:
        raise ValueError(f"bad range: offset {offset}, length {length}")


def read_exact(fd: int, start: int, length: int) -> bytes:
    """``length`` bytes of a caller's file at ``start``; its errors stay ``OSError`` (a short
    file is EIO: the caller promised ``size`` bytes)."""
    out = bytearray()
    while len(out) < length:
        piece = os.pread(fd, length - len(out), start + len(out))
        if not piece:
            raise OSError(5, f"source file ended at {start + len(out)}, expected {length} bytes")
        out += piece
    return bytes(out)


def meta_threads(concurrency: int) -> int:
    """Threads for metadata calls, beside the ``2 * concurrency`` for transfers (an engine
    with a connection pool sizes it for both)."""
    return max(4, concurrency // 2)


def part_size_for(size: int, part_size: int) -> int:
    """``part_size`` raised (to whole MiB) so that ``size`` needs at most 10,000 parts."""
    if size <= part_size * 10_000:
        return part_size
    mib = 1 << 20
    return -(-size // 10_000 // mib) * mib + mib


# --- the interface --------------------------------------------------------------------------


Source = str | os.PathLike[str] | int


class ObjectTier(abc.ABC):
    """A store of whole objects under one prefix.  All methods are coroutines and safe to
    call concurrently; blocking work runs on the tier's bounded thread pool."""

    #: the store's URL without credentials (for logs and errors)
    url: str
    #: seconds a metadata call may take (retries included) before the store counts as
    #: unavailable, and a call may wait without any answer before it counts as hung
    call_timeout: float = 30.0

    def __init__(self, url: str, transfer: TransferOptions | None = None) -> None:
        self.url = url
        self.transfer = transfer or TransferOptions()
        self.health = Health()
        # Twice the per-operation window: one large transfer cannot take every thread.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2 * self.transfer.concurrency, thread_name_prefix="tierd-cold"
        )
        # Metadata calls (head, list, delete, probe) have threads of their own: queued
        # behind long transfers they would run past ``call_timeout`` and a store that is
        # busy, not silent, would count as unreachable.
        self._meta_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=meta_threads(self.transfer.concurrency),
            thread_name_prefix="tierd-cold-meta",
        )
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- the operations ----------------------------------------------------------------------

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo | None:
        """The object's size, ETag and mtime, or ``None`` if there is none."""

    @abc.abstractmethod
    async def get_range(
        self, key: str, offset: int, length: int, *, if_match: str | None = None
    ) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end, ``b""`` past it).

        Large lengths are fetched as parallel ranged GETs.  With ``if_match`` the object must
        still have that ETag (else :class:`ObjectChanged`)."""

    @abc.abstractmethod
    async def read_into(
        self,
        key: str,
        offset: int,
        length: int,
        fd: int,
        fd_offset: int,
        *,
        if_match: str | None = None,
        range_size: int | None = None,
    ) -> int:
        """Copy ``[offset, offset+length)`` of the object into ``fd`` at ``fd_offset``.

        ``range_size`` overrides the tier's ranged-GET size for this call (placement sizes
        the ranges of a sequential stream's readahead to its window).

        Returns the number of bytes written (short at the object's end).  This is how
        placement fills the hot tier: large lengths go as parallel ranged GETs streamed
        straight into the file, never whole in memory.  All ranges come from one version of
        the object (the ETag read first, or ``if_match``): a concurrent overwrite raises
        :class:`ObjectChanged` instead of mixing versions.  Errors writing ``fd`` propagate
        as ``OSError``."""

    @abc.abstractmethod
    async def put_file(
        self, key: str, source: Source, size: int, *, md5_hex: str | None = None
    ) -> ObjectInfo:
        """Store the first ``size`` bytes of a local file (a path, or a descriptor read with
        ``pread`` from offset 0 without moving its position) as the object ``key``.

        Atomic: readers see the old object or the whole new one.  At least
        ``multipart_threshold`` bytes go as a multipart upload with parallel parts.
        ``md5_hex``, when the caller already has the content's MD5, is sent for the store to
        verify (single PUT) and spares a hashing pass where the engine would compute one."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the object; removing a missing object succeeds (as in S3)."""

    async def delete_many(self, keys: Sequence[str]) -> dict[str, TierError | None]:
        """Remove several objects: each key's outcome, ``None`` when it is gone (removed,
        or there was nothing), else the :class:`TierError` :meth:`delete` would have raised
        for it -- a :class:`TierUnavailable` among them when the store failed that key.
        Raises :class:`TierUnavailable` when the store cannot be used at all (then nothing
        is known of any key).  Engines with a bulk call override this (S3's
        ``DeleteObjects``: one request for up to 1000 keys, where the pending deletes of a
        ``rm -r`` would cost one each); this default runs :meth:`delete` per key."""
        out: dict[str, TierError | None] = {}
        for key in keys:
            try:
                await self.delete(key)
            except TierUnavailable:
                raise
            except TierError as e:
                out[key] = e
            else:
                out[key] = None
        return out

    @abc.abstractmethod
    async def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        """Copy an object inside the store (server-side where the store can), e.g. to make
        the cold copy follow a rename in the background.  :class:`ObjectNotFound` if
        ``src_key`` is missing."""

    @abc.abstractmethod
    async def list(
        self, prefix: str, start_after: str = "", delimiter: str = "", limit: int = MAX_LIST
    ) -> ListPage:
        """Objects whose key starts with ``prefix`` and sorts after ``start_after``, in UTF-8
        byte order, at most ``limit`` (1-1000) entries counting common prefixes.

        With a ``delimiter``, keys containing it after the prefix are rolled up into one
        common prefix each (``photos/`` for ``photos/cat.jpg`` with delimiter ``/``).  Pass
        ``page.next_start_after`` to continue; a common prefix given as ``start_after``
        skips everything below it."""

    async def probe(self) -> None:
        """Check that the store answers; raise :class:`TierUnavailable` if not.

        Placement calls it to notice when a store that failed is back (then it resumes
        persisting) and, when the store was idle for a while, that it still answers.  The
        default lists one key."""
        await self.list("", limit=1)

    def reachable(self) -> bool:
        """Whether the store answers now, as far as its calls tell (:class:`Health`)."""
        return self.health.reachable(self.call_timeout)

    def describe_health(self) -> dict[str, Any]:
        return self.health.describe(self.call_timeout)

    async def close(self) -> None:
        """Release threads and connections.  Waits for running blocking calls."""
        if self._closed:
            return
        self._closed = True
        for pool in (self._pool, self._meta_pool):
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(pool.shutdown, wait=True)
            )

    # -- helpers for the engines -------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any,
                   pool: concurrent.futures.Executor | None = None) -> T:
        """Run one blocking call on the pool (the transfers', unless ``pool``); its outcome
        goes to :attr:`health`."""
        if self._closed:
            raise TierUnavailable(f"cold store {self.url} is closed")
        cf = (pool or self._pool).submit(fn, *args)
        return await self._tracked(asyncio.wrap_future(cf))

    async def _meta(self, fn: Callable[..., T], *args: Any) -> T:
        """A metadata call (head, list, delete, probe): :meth:`_run` on the metadata
        threads with a deadline of :attr:`call_timeout` seconds, after which the store
        counts as unavailable (the thread may still be stuck in the call; its result is
        ignored)."""
        try:
            return await asyncio.wait_for(self._run(fn, *args, pool=self._meta_pool),
                                          self.call_timeout)
        except TimeoutError:
            err = TierUnavailable(f"cold store {self.url} did not answer within "
                                  f"{self.call_timeout:g} s")
            self.health.end(self.health.begin(), False, str(err))
            raise err from None

    async def _tracked(self, aw: Awaitable[T]) -> T:
        call = self.health.begin()
        try:
            result = await aw
        except TierThrottled:
            self.health.end(call, True)  # an answer: the store is up, and busy
            raise
        except TierUnavailable as e:
            self.health.end(call, False, str(e))
            raise
        except TierError:
            self.health.end(call, True)  # an answer: no such key, changed, conflict...
            raise
        except BaseException:
            self.health.end(call, None)
            raise
        self.health.end(call, True)
        return result

    async def _fill(
        self, fd: int, offset: int, n: int,
        fetch: Callable[[int, int, int, threading.Event], int],
        range_size: int | None = None,
    ) -> int:
        """The body of every engine's ``read_into``: ``fetch(dst, start, length, stop)``
        writes object bytes ``[start, start+length)`` into ``dst`` (with :func:`write_dest`)
        for each ``range_size`` piece of ``[offset, offset+n)``, in parallel on the pool;
        returns the bytes written.  The caller's descriptor is duplicated for the duration,
        and an error writing it reaches the caller as the plain ``OSError`` it is."""
        dst = os.dup(fd)
        try:
            ranges = split_ranges(offset, n, range_size or self.transfer.range_size)
            jobs = [functools.partial(fetch, dst, o, ln) for o, ln in ranges]
            return sum(await self._parallel(jobs))
        except DestinationError as e:
            raise e.error from None
        finally:
            os.close(dst)

    async def _parallel(
        self, jobs: Sequence[Callable[[threading.Event], T]]
    ) -> builtins.list[T]:
        """Run blocking jobs on the pool, at most ``concurrency`` at once, results in order.

        Each job gets a ``threading.Event`` that is set when the operation is abandoned (a job
        failed, or the caller was cancelled); long jobs check it between pieces.  Before
        raising, this waits for every started job to return, because jobs may write into a
        caller's descriptor that the caller reuses as soon as we return."""
        if self._closed:
            raise TierUnavailable(f"cold store {self.url} is closed")
        stop = threading.Event()
        if len(jobs) == 1:
            started = [self._pool.submit(jobs[0], stop)]
            try:
                return [await self._tracked(asyncio.wrap_future(started[0]))]
            except BaseException:
                stop.set()
                await _settle(started)
                raise
        sem = asyncio.Semaphore(self.transfer.concurrency)
        started = []

        async def one(job: Callable[[threading.Event], T]) -> T:
            async with sem:
                if stop.is_set():
                    raise asyncio.CancelledError
                cf = self._pool.submit(job, stop)
                started.append(cf)
                return await self._tracked(asyncio.wrap_future(cf))

        tasks = [asyncio.ensure_future(one(j)) for j in jobs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            stop.set()
            for t in tasks:
                t.cancel()
            await _settle(started)
            await asyncio.gather(*tasks, return_exceptions=True)
            raise


async def _settle(futures: Sequence[concurrent.futures.Future[Any]]) -> None:
    """Wait until every thread future is finished, even if we are cancelled meanwhile
    (the cancellation is re-delivered by the caller's ``raise``)."""
    pending = {asyncio.wrap_future(f) for f in futures if not f.done()}
    waited = set(pending)
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            continue
    for w in waited:  # their errors are reported by the caller's raise, not by the GC
        if not w.cancelled():
            w.exception()
