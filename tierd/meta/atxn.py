"""Metadata transactions for coroutines: ``async with meta.awrite() as tx`` (and
``meta.asnapshot()``), whose begin and commit never block the event loop.

The body between them is the same synchronous code as in ``with meta.write() as tx``, run
on the loop.  Over an engine that waits on the network (``KVStore.remote``: PostgreSQL) the
begin -- for a writer, the wait for the cluster's writer lock -- and the writing commit run in
threads (:mod:`tierd.meta.pg_async`), and other coroutines run meanwhile.  Over the embedded
engines (lmdb behind group commit, memory) both run inline and nothing yields: such a
transaction is exactly as fast, and as atomic towards other coroutines, as the synchronous
one.

What the caller must keep in mind over PostgreSQL: other coroutines may run while the commit
is in flight (the ``await`` in ``__aexit__``), so in-memory state that must agree with the
committed metadata changes *after* the ``async with`` block, as it already had to for a
commit that fails.  A commit, once sent, completes even if the task is cancelled (the
cancellation reaches the task at its next await).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tierd.meta.kv import KVTxn
    from tierd.meta.pg_warm import Warm
    from tierd.meta.store import MetaStore, MetaTxn

T = TypeVar("T")


def behind(meta: MetaStore, tx: MetaTxn) -> bool:
    """Whether a write commit of this process landed after ``tx``'s snapshot was taken:
    over PostgreSQL a coroutine's snapshot may be older than a commit whose body ran while
    its begin was in a thread (never over the embedded engines: False)."""
    seq: int | None = getattr(tx.kv, "seq", None)
    return seq is not None and seq < getattr(meta.engine, "local_seq", 0)


async def off_loop(meta: MetaStore, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, synchronous code that runs whole transactions of ``meta`` and touches
    no state of the event loop (the admin API's user directory): in a worker thread over
    an engine that waits on the network, inline over the embedded ones."""
    if meta.engine.remote:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


class AsyncTxn:
    """One transaction of ``store``: ``write``, or a read that ``snapshot`` always aborts."""

    __slots__ = ("_bounded", "_fresh", "_keys", "_snapshot", "_store", "_tx", "_warm",
                 "_write")

    def __init__(self, store: MetaStore, write: bool, snapshot: bool = False,
                 fresh: bool = False, keys: Iterable[bytes] = (),
                 warm: Callable[[MetaTxn], object] | None = None,
                 bounded: bool = False) -> None:
        self._store = store
        self._bounded = bounded
        self._write = write
        self._snapshot = snapshot
        self._fresh = fresh
        self._keys = keys
        self._warm = warm
        self._tx: MetaTxn | None = None

    def _prefetch(self) -> Warm | None:
        """The body's reads for the engine to make in the begin's thread (pg_warm)."""
        fn, node = self._warm, self._store.node
        if fn is None and not self._keys:
            return None
        from tierd.meta.pg_warm import Warm
        from tierd.meta.store import MetaTxn

        def run(kv: KVTxn) -> object:
            assert fn is not None
            return fn(MetaTxn(kv, node))
        return Warm(tuple(self._keys), None if fn is None else run)

    async def __aenter__(self) -> MetaTxn:
        from tierd.meta.store import MetaTxn

        engine: Any = self._store.engine
        if engine.remote:
            kv = await engine.abegin(self._write, fresh=self._fresh,
                                     warm=self._prefetch(), bounded=self._bounded)
        else:
            kv = engine.begin(write=self._write)
        self._tx = MetaTxn(kv, self._store.node)
        return self._tx

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tx, self._tx = self._tx, None
        assert tx is not None, "transaction not begun"
        commit = exc_type is None and not self._snapshot
        engine: Any = self._store.engine
        if engine.remote:
            await engine.aend(tx.kv, commit)
            if commit:
                tx.committed()
        elif commit:
            tx.commit()
        else:
            tx.kv.abort()
