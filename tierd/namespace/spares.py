"""Data files made ahead for new files: inode numbers reserved in batches, each with its empty
hot data file already created, for the FUSE creates whose writes the kernel will pass
through.

Why: such a create hands the kernel the file's hot data file (passthrough), so the file must
exist when the create is answered.  Creating it on the event loop may wait behind a sync of
the file system (measured here with a 1 GiB ``dd ... conv=fsync`` beside the creates: p99
0.75 ms, max 4.9 ms); in a worker thread it cost each create a thread hop -- a wake-up of
the thread, the interpreter lock handed back and forth, a wake-up of the loop -- that was a
fifth of the create's latency (820 against 1,030 creates/s with the create made inline) and
~250 us of a second thread's CPU.  A spare costs the create one lookup of a file that
exists, and a batch of :data:`BATCH` costs one hop; the batch's files are made by a helper
process (:mod:`tierd.tiers.filemaker`), so the thread takes the interpreter lock once per
batch rather than twice per file.

How many: a refill starts when fewer than :data:`LOW` are left and makes batches until
:data:`HIGH` are ready.  One batch of 32 per refill, started with 8 left, let a burst of
creates use them up before the next batch was made wherever the file system's creates were
slow (an ext4 without a journal, which took 0.3-0.8 ms of CPU per new file while it passed
over the inodes freed in the minutes before): 730 of 3,000 creates then made their own
files in a worker thread beside the helper.  With these depths
10,000 creates ran at 1,725-1,802/s against 1,400-1,471 (``bench/create_latency.py``,
docs/fuse.md).  The pool costs at most ``HIGH + BATCH`` empty files, removed at close.

What keeps it safe:

* A spare's number was reserved in a transaction of its own (the ``next_ino`` counter moved
  past the batch): nothing else -- a PUT, a mkdir, an import -- is handed it.
* A spare is used only by a create whose transaction commits with it (:meth:`take`); one
  that fails, or finds the name taken, gives it back (:meth:`give_back`).
* A create that fails once its inode had the number may have committed (:meth:`doubt`): the
  number is never handed out again, and at :meth:`close` its file is removed only if no
  inode has the number.
* Unused spares' files are removed at :meth:`close`.  After an unclean stop they have no
  inode and their numbers are under the counter's skip, so
  :meth:`~tierd.namespace.garbage.Garbage.remove_unnamed` removes them.
* Only on an embedded metadata engine (over a shared one the counter is the cluster's and
  each number a round trip), and only for a create that may pass writes through: no memory-
  tier policy is set and no bit a write clears is asked for (``has_privs``: setuid, setgid
  with group execute).  Any other new file makes its data file when it first needs one, as
  before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tierd.meta import MetaStore
    from tierd.tiers.hotdir import HotDir

log = logging.getLogger(__name__)

#: numbers reserved, and data files made, per batch (one transaction, one thread hop)
BATCH = 64
#: a refill starts when fewer spares than this are left
LOW = 128
#: a refill makes batches until this many are ready
HIGH = 256
#: seconds after a refill failed (a full or read-only disk) before the next is tried
RETRY = 30.0


class Spares:
    """The reserved numbers whose empty data files exist (see the module doc)."""

    def __init__(self, meta: MetaStore, hot: HotDir) -> None:
        self.meta = meta
        self.hot = hot
        self._ready: collections.deque[int] = collections.deque()
        self._doubtful: list[int] = []
        self._refill: asyncio.Task[None] | None = None
        self._closed = False
        self._failed_at: float | None = None  # the last refill failed then (monotonic)

    def take(self) -> int:
        """A spare number (its data file exists), or 0 when none is ready; a caller whose
        transaction does not commit with it calls :meth:`give_back`.  Starts a refill when
        few are left."""
        ino = self._ready.popleft() if self._ready else 0
        if len(self._ready) < LOW and self._refill is None and not self._closed and (
                self._failed_at is None or time.monotonic() - self._failed_at > RETRY):
            self._refill = asyncio.get_running_loop().create_task(self._fill())
        return ino

    def give_back(self, ino: int) -> None:
        """``ino`` (from :meth:`take`) was not used: a later create takes it."""
        if ino:
            self._ready.appendleft(ino)

    def doubt(self, ino: int) -> None:
        """``ino`` (from :meth:`take`) went to a create that failed once the number was
        given: it may have committed.  Not handed out again; checked at :meth:`close`."""
        self._doubtful.append(ino)

    def __len__(self) -> int:
        return len(self._ready)

    async def _fill(self) -> None:
        try:
            while not self._closed and len(self._ready) < HIGH:
                async with self.meta.awrite() as tx:
                    inos = tx.reserve_inos(BATCH)
                made = await asyncio.to_thread(self.hot.make_files, inos)
                if self._closed:
                    await asyncio.to_thread(self._remove, made)
                else:
                    self._ready.extend(made)
                self._failed_at = None
                if len(made) < len(inos):
                    break  # the file system refused one: the next create starts again
        except Exception as e:  # a full or read-only disk: creates make their own files
            if self._failed_at is None:
                log.warning("could not make data files ahead for new files (%s); new files "
                            "make theirs as they are created, and this is tried again "
                            "every %g s", e, RETRY)
            self._failed_at = time.monotonic()
        finally:
            self._refill = None

    def _remove(self, inos: list[int]) -> None:
        for ino in inos:
            self.hot.remove(ino)

    async def close(self) -> None:
        """Remove the data files of the spares no create used."""
        self._closed = True
        if self._refill is not None:
            await asyncio.shield(self._refill)
        left = list(self._ready)
        self._ready.clear()
        if self._doubtful:
            with self.meta.snapshot() as tx:
                left += [ino for ino in self._doubtful if tx.get_inode(ino) is None]
            self._doubtful.clear()
        if left:
            await asyncio.to_thread(self._remove, left)
