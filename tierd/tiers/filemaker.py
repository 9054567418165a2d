"""Empty data files made in batches by a helper process (the hot tier's spares).

Why a process: the FUSE door's creates whose writes the kernel passes through each need an
empty hot data file, and ``tierd.namespace.spares`` has them made ahead, a batch at a
time, off the event loop.  Made by a worker thread, each file was two system calls
(``open`` with ``O_CREAT``, ``close``) after each of which the thread took the interpreter
lock back from the event loop: on two vCPUs the loop lost 40-70 us of CPU per create to
those hand-overs, and the worker threads spent 170-200 us per file, much of it in
hand-overs.  A helper process makes the same files with its own interpreter: one pipe
message per batch, nothing shared with the loop (``bench/create_latency.py``: 1,724-1,781
creates/s against 1,377-1,488; docs/fuse.md, "Spare data files made by a helper
process").

The helper is this module run as a script with ``-I -S`` (no site, no environment, nothing
of tierd imported: it starts in a few tens of milliseconds and holds a few MB), started at
the first batch.  It and the fallback make each file with :func:`create_new`, which
:meth:`LocalTier.open_file` uses for a missing file too: ``O_CREAT | O_EXCL`` at mode
0600, the shard directory made when missing; a file that exists already counts as made,
as ``open_file`` opens it.  Nothing is synced, as before: a data file's
directory entry is made durable at the file's first durability point
(:meth:`LocalTier.fsync` syncs the directory of every file in its ``_new`` set, to which
the caller adds these).

If the helper cannot start or dies, the batch is made in the calling thread, as before, and
the helper is started again at the next batch (at most once per :data:`RESTART` seconds).
When the daemon dies, the helper reads the end of its input and exits; at a clean stop
:meth:`FileMaker.close` ends it.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import BinaryIO

log = logging.getLogger("tierd.tiers")

#: seconds after the helper failed before it is started again
RESTART = 30.0
#: seconds a stopping helper gets to exit before it is killed
STOP_WAIT = 5.0


def create_new(path: str | bytes) -> int | None:
    """An ``O_RDWR`` descriptor on a file made new and empty at ``path``, mode 0600, or None
    when a file is there already.  The shard directory nearly always exists: it is made
    only when the create says it is missing (two system calls for a new file, not five)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return os.open(path, flags, 0o600)
    except FileExistsError:
        return None


def make_all(paths: Sequence[bytes]) -> tuple[int, int]:
    """Make the files of ``paths`` in order (an existing one is left as it is), stopping
    at the first that fails: (how many were made, that one's errno or 0)."""
    for made, p in enumerate(paths):
        try:
            fd = create_new(p)
        except OSError as e:
            return made, e.errno or errno.EIO
        if fd is not None:
            os.close(fd)
    return len(paths), 0


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The helper's loop, until its input ends.  In: per batch a line with the payload's
    length, then the paths, NUL-separated (a path holds no NUL).  Out: per batch
    ``MADE ERRNO``, as :func:`make_all` returns them."""
    while head := inp.readline():
        made, err = make_all(inp.read(int(head)).split(b"\0"))
        out.write(b"%d %d\n" % (made, err))
        out.flush()


class FileMaker:
    """Makes empty files through one helper process (see the module doc); thread-safe,
    blocking: call :meth:`make` in a worker thread."""

    def __init__(self) -> None:
        self._use_process = bool(sys.executable)  # (empty where Python is embedded)
        self._proc: subprocess.Popen[bytes] | None = None
        self._failed_at: float | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The helper's process id while it runs (for tests and diagnostics)."""
        p = self._proc
        return p.pid if p is not None and p.poll() is None else None

    def make(self, paths: Sequence[bytes]) -> int:
        """Make the files of ``paths`` (empty, 0600; an existing one is left as it is), in
        order, stopping at the first that fails: how many were made.  Raises the ``OSError``
        of the first path when none could be made."""
        if not paths:
            return 0
        answer: tuple[int, int] | None = None
        with self._lock:
            proc = self._helper()
            if proc is not None:
                try:
                    answer = self._ask(proc, paths)
                    self._failed_at = None  # a later failure is logged again
                except (OSError, ValueError) as e:
                    self._lost(f"it failed ({e})")
        made, err = answer if answer is not None else make_all(paths)
        if err:
            failure = OSError(err, os.strerror(err), os.fsdecode(paths[made]))
            if not made:
                raise failure
            log.warning("could not make a data file ahead (%s)", failure)
        return made

    @staticmethod
    def _ask(proc: subprocess.Popen[bytes], paths: Sequence[bytes]) -> tuple[int, int]:
        assert proc.stdin is not None and proc.stdout is not None
        payload = b"\0".join(paths)
        proc.stdin.write(b"%d\n" % len(payload) + payload)
        proc.stdin.flush()
        reply = proc.stdout.readline()
        if not reply:
            raise OSError("the helper exited")
        made, err = (int(x) for x in reply.split())
        if not 0 <= made <= len(paths) or (err and made == len(paths)):
            raise ValueError(f"the helper answered {reply!r}")
        return made, err

    def _helper(self) -> subprocess.Popen[bytes] | None:
        """The running helper, started when there is none (None: make files here)."""
        if self._closed or not self._use_process:
            return None
        if self._proc is not None:
            if self._proc.poll() is None:
                return self._proc
            self._lost(f"it exited with status {self._proc.returncode}")
        if self._failed_at is not None and time.monotonic() - self._failed_at < RESTART:
            return None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                start_new_session=True)  # a terminal's ^C is the daemon's to handle
        except OSError as e:
            self._lost(f"it could not start ({e})")
            return None
        return self._proc

    def _lost(self, why: str) -> None:
        if self._failed_at is None:
            log.warning("the helper process that makes data files ahead is not running: "
                        "%s; the daemon makes them itself, and starts a helper again after "
                        "%g s", why, RESTART)
        self._failed_at = time.monotonic()
        self._stop()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            proc.wait(STOP_WAIT)  # its input ended: it exits
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """End the helper (blocking for up to :data:`STOP_WAIT` s: call in a thread)."""
        with self._lock:
            self._closed = True
            self._stop()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
