"""The transactional key-value contract every metadata engine implements.

Modelled on JuiceFS's ``tkv``: an engine only needs ordered keys, point reads, range scans and
atomic read-write transactions with snapshot reads.  All file-system meaning lives above, in
:mod:`tierd.meta.store` and :mod:`tierd.namespace`, so a second engine (a shared SQL or
distributed KV store for several nodes) implements this file and nothing else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from types import TracebackType


class KVTxn(ABC):
    """One transaction.  Reads see a consistent snapshot plus this transaction's own writes."""

    write: bool

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key`` (write transactions only: PermissionError otherwise)."""

    @abstractmethod
    def delete(self, key: bytes) -> bool:
        """Remove ``key``; True if it existed (write transactions only: PermissionError
        otherwise)."""

    @abstractmethod
    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with ``start <= key < end`` in byte order (descending when ``reverse``).

        The iterator is lazy so a listing touches only the keys it returns; it must not be
        used after the transaction ends.
        """

    def prefetch(self, keys: list[bytes]) -> None:
        """A hint that :meth:`get` will be asked for ``keys``: an engine that waits on the
        network for a get reads them all now in one round trip (PostgreSQL); an embedded
        one has nothing to gain and ignores it.  What the gets answer does not change."""
        return None

    def absent(self, key: bytes) -> None:
        """A hint that ``key`` does not exist before this transaction writes it (a key of
        a new inode: the number was never used).  An engine that reads over the network
        (PostgreSQL) then answers a get of it without a round trip; the others ignore it.
        The caller must know: on such an engine a wrong hint is a wrong answer."""
        return None

    def empty_prefix(self, prefix: bytes) -> None:
        """A hint that no key starts with ``prefix`` when this transaction commits but those
        it writes (a new inode's attributes, a new directory's entries: the number was never
        used).  An engine with a read cache
        (PostgreSQL) may then answer a key under it absent without a round trip, until a
        change under it is seen; the others ignore it.  What a get answers does not change."""
        return None

    @abstractmethod
    def commit(self) -> None:
        """Make the writes visible atomically.  Durable against a process crash at once and
        against a machine crash after the next :meth:`KVStore.sync`."""

    @abstractmethod
    def abort(self) -> None:
        """Discard every write of this transaction."""

    def __enter__(self) -> KVTxn:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class KVStore(ABC):
    """An engine: opens transactions, syncs to stable storage, closes."""

    name: str
    #: True when begin and commit wait on the network: the engine then has ``abegin`` and
    #: ``aend``, which MetaStore's async transactions await (embedded engines stay inline)
    remote = False

    @abstractmethod
    def begin(self, write: bool = False) -> KVTxn:
        """Start a transaction.  Only one write transaction is open at a time per store; the
        caller must never await while holding one (it would stall every other writer)."""

    @abstractmethod
    def sync(self) -> None:
        """Flush committed transactions to stable storage (may block: call from a thread)."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine's resources."""

    def stat(self) -> dict[str, int]:
        """Engine-specific size figures for status pages (may be empty)."""
        return {}

    #: what an operator does about a full store (the engine knows its knobs)
    space_hint = "free some space"

    def headroom(self) -> int | None:
        """Bytes of new metadata that still fit (None: the engine does not know)."""
        return None

    def keep_reserve(self) -> None:
        """Called after a durable flush: an engine that keeps space aside for itself on a
        shared file system tops it up here (see :mod:`tierd.meta.lmdb_engine`)."""
        return None


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None
