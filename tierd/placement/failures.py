"""Per-file persist failures: a capped back-off, files the store cannot take, quiet logs.

A failure of one file is the file's: it backs off alone (doubling from ``retry_delay`` up
to :data:`RETRY_MAX`), and the cold store stays reachable for every other file.  A file
whose key the store refuses (:class:`~tierd.tiers.KeyRejected`, an invalid key) or that
failed :data:`UNPERSISTABLE_AFTER` times in a row while the store answered is marked
**unpersistable**: the status (``/v1/status`` ``placement.queue``, ``tierctl status``) and
``persist --wait`` name it with the error, and it is tried again every
:data:`UNPERSISTABLE_RETRY` seconds and at once after a rename.  Logs say the first failure,
the marking, and then at most one line per file every :data:`LOG_EVERY` seconds with the
count: a file failing in a loop must not fill the disk with its log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

RETRY_MAX = 30.0
UNPERSISTABLE_AFTER = 5
UNPERSISTABLE_RETRY = 300.0
LOG_EVERY = 60.0


@dataclass(slots=True)
class Failure:
    """One file's run of consecutive failures."""

    key: str
    error: str
    failures: int = 0
    since: float = 0.0  # wall clock of the first failure of the run
    unpersistable: bool = False
    logged_at: float = -1e18  # monotonic
    logged_count: int = 0


class Failures:
    """The failing files (inode -> :class:`Failure`)."""

    def __init__(self, retry_delay: float) -> None:
        self.retry_delay = retry_delay
        self.by_ino: dict[int, Failure] = {}

    def record(self, ino: int, key: str, error: BaseException, *,
               permanent: bool) -> tuple[float, str | None]:
        """A failure of ``ino`` (``permanent``: the store can never take its key as it is).
        Returns the back-off in seconds and the log line to write, if one is due."""
        f = self.by_ino.get(ino)
        if f is None:
            f = self.by_ino[ino] = Failure(key, "", since=time.time())
        f.key, f.error = key, f"{type(error).__name__}: {error}"
        f.failures += 1
        marked = not f.unpersistable and (permanent or f.failures >= UNPERSISTABLE_AFTER)
        if marked:
            f.unpersistable = True
        if f.unpersistable and permanent:
            delay = UNPERSISTABLE_RETRY
        else:
            # the exponent is capped too: 2 ** n for a large n overflows a float
            delay = min(self.retry_delay * 2 ** min(f.failures - 1, 20), RETRY_MAX)
        return delay, self._line(ino, f, marked, delay)

    @staticmethod
    def _line(ino: int, f: Failure, marked: bool, delay: float) -> str | None:
        now = time.monotonic()
        if not (f.failures == 1 or marked or now - f.logged_at >= LOG_EVERY):
            return None
        since = f.failures - f.logged_count
        f.logged_at, f.logged_count = now, f.failures
        if marked:
            return (f"inode {ino} ({f.key}) cannot be persisted: {f.error}; marked "
                    f"unpersistable after {f.failures} tries (the cold store stays in use for "
                    "every other file; tried again every "
                    f"{delay:.0f} s and after a rename; see tierctl status)")
        more = f" ({since} failures since the last report)" if since > 1 else ""
        return (f"persisting inode {ino} ({f.key}) failed{more}, "
                f"retrying in {delay:.1f} s: {f.error}")

    def clear(self, ino: int) -> Failure | None:
        """The file persisted (or left the queue): forget its failures."""
        return self.by_ino.pop(ino, None)

    def unpersistable(self, ino: int) -> bool:
        f = self.by_ino.get(ino)
        return f is not None and f.unpersistable

    def describe(self, limit: int = 20) -> dict[str, Any]:
        """For the status document: counts and the first ``limit`` unpersistable files."""
        bad = [(ino, f) for ino, f in self.by_ino.items() if f.unpersistable]
        return {
            "failing": len(self.by_ino),
            "unpersistable": len(bad),
            "unpersistable_files": [
                {"ino": ino, "key": f.key, "error": f.error, "failures": f.failures,
                 "since": round(f.since, 3)}
                for ino, f in sorted(bad)[:limit]],
        }
