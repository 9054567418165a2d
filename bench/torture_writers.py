"""The crash-torture harness's writers and its killer (see ``bench/torture.py``).

Writers are threads, each owning its keys, so at most one operation per key is in flight and
the journal (:mod:`torture_model`) knows what each key may hold.  Every operation calls
:meth:`Journal.begin` before its first request or syscall and :meth:`Journal.ack` only once it
is acknowledged: the S3 call returned success, or ``fsync`` returned (and the directory's
``fsync`` for a name created, replaced or removed).

The :class:`Killer` sends SIGKILL once per cycle: at a random time, or at a kill point a
writer passes -- ``s3-send`` (a mutating S3 request is about to go out: the kill lands 0-20 ms
into it) or ``fuse-ns`` (a ``rename``, ``unlink`` or ``open(O_TRUNC)`` just returned: the kill
lands 0-5 ms after, before the directory or file is fsynced).
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torture_model import Journal, KeyRecord, Piece, Version, multipart_etag, splice

#: S3 part size of the multipart uploads (the daemon runs with a smaller s3_min_part_size)
PART = 256 << 10
#: FUSE files larger than this are rewritten whole instead of appended to or patched
FUSE_CAP = 1 << 20
MUTATING = frozenset({"PUT", "POST", "DELETE"})


class Killer:
    """SIGKILLs one daemon process once; records how and when."""

    def __init__(self, proc: subprocess.Popen[bytes], seed: int) -> None:
        self.proc = proc
        self.fired = threading.Event()
        self.how = ""
        self.at = 0.0
        self.wall = 0.0
        self._armed: str | None = None
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def arm(self, point: str) -> None:
        """Kill at the next ``point`` a writer passes (``s3-send`` or ``fuse-ns``)."""
        self._armed = point

    def point(self, point: str) -> None:
        """A writer passes ``point``; fires the armed kill after a short random delay.

        At ``fuse-ns`` the writer waits here for the kill: the file system is left as the
        rename, unlink or ``open(O_TRUNC)`` left it, before the fsyncs that would make it
        durable -- the window in which an old version's bytes must still exist."""
        if self._armed != point:
            return
        with self._lock:
            if self._armed != point or self.fired.is_set():
                return
            self._armed = None
            delay = self._rng.uniform(0, 0.02 if point == "s3-send" else 0.005)
        t = threading.Timer(delay, self.kill, (f"{point}+{delay * 1000:.1f}ms",))
        t.daemon = True
        t.start()
        if point == "fuse-ns":
            self.fired.wait(5)
            time.sleep(0.05)  # the process is gone before the writer's next syscall

    def kill(self, how: str) -> None:
        with self._lock:
            if self.fired.is_set():
                return
            self.fired.set()
            self.how, self.at, self.wall = how, time.monotonic(), time.time()
            self._armed = None
        self.proc.send_signal(signal.SIGKILL)


class Writer(threading.Thread):
    """One writer thread: picks an owned key and an operation until ``stop`` is set.

    ``errors`` counts failures while the daemon was alive (``op: error``), with a few
    samples: they are not violations (an error leaves the key's outcome pending), but an
    InternalError or EIO while nothing was killed is worth reading."""

    kind = "writer"

    def __init__(self, name: str, journal: Journal, keys: list[str], killer: Killer,
                 stop: threading.Event, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.journal = journal
        self.keys = keys
        self.killer = killer
        self.stop = stop
        self.rng = random.Random(seed)
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []
        self.ops = 0

    def run(self) -> None:
        while not self.stop.is_set() and not self.killer.fired.is_set():
            live = [k for k in self.keys if self.journal.records[k].quarantined is None]
            if not live:
                return
            rec = self.journal.records[self.rng.choice(live)]
            name, op = self.pick(rec)
            try:
                op(rec)
                self.ops += 1
            except Exception as e:  # the outcome stays pending in the journal
                if self.killer.fired.is_set():
                    return
                why = f"{name}: {describe_error(e)}"
                self.errors[why] += 1
                if len(self.samples) < 5:
                    self.samples.append(f"{rec.key}: {why}")
                time.sleep(0.01)

    def pick(self, rec: KeyRecord) -> tuple[str, Callable[[KeyRecord], None]]:
        raise NotImplementedError

    def choose(self, table: list[tuple[str, int, Callable[[KeyRecord], None]]]
               ) -> tuple[str, Callable[[KeyRecord], None]]:
        names, weights, ops = zip(*table, strict=True)
        i = self.rng.choices(range(len(table)), weights=weights)[0]
        return names[i], ops[i]

    def new_version(self, label: str, key: str, size: int, **kw: Any) -> Version:
        seq = self.journal.next_seq()
        return self.journal.version(label, seq, (Piece(f"{key}#{seq}", 0, size),), **kw)


def describe_error(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno is not None:
        return errno.errorcode.get(e.errno, str(e.errno))
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error", {})
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{err.get('Code', '?')} ({status})"
    return type(e).__name__


# -- S3 ----------------------------------------------------------------------------------------


class S3Writer(Writer):
    """Small and multi-MB PUTs, multipart uploads, overwrites, deletes and CopyObject."""

    kind = "s3"

    def __init__(self, name: str, journal: Journal, keys: list[str], killer: Killer,
                 stop: threading.Event, seed: int, client: Any, bucket: str,
                 large: int) -> None:
        super().__init__(name, journal, keys, killer, stop, seed)
        self.s3 = client
        self.bucket = bucket
        self.large = large

    def pick(self, rec: KeyRecord) -> tuple[str, Callable[[KeyRecord], None]]:
        table: list[tuple[str, int, Callable[[KeyRecord], None]]] = [
            ("put-small", 30, self.put_small), ("delete", 12, self.delete),
            ("put-large", 6 if self.large else 0, self.put_large), ("multipart", 6, self.mpu)]
        if self.sources(rec):
            table.append(("copy", 10, self.copy))
        return self.choose(table)

    def sources(self, rec: KeyRecord) -> list[KeyRecord]:
        recs = (self.journal.records[k] for k in self.keys if k != rec.key)
        return [r for r in recs if r.acked.present and not r.ambiguous
                and r.quarantined is None]

    def put(self, rec: KeyRecord, label: str, size: int) -> None:
        v = self.new_version(label, rec.key, size)
        body = v.data()
        self.journal.begin(rec.key, v)
        self.s3.put_object(Bucket=self.bucket, Key=rec.key, Body=body)
        self.journal.ack(rec.key, v, label)

    def put_small(self, rec: KeyRecord) -> None:
        size = 0 if self.rng.random() < 0.05 else self.rng.randint(1, 64 << 10)
        self.put(rec, "put-small", size)

    def put_large(self, rec: KeyRecord) -> None:
        self.put(rec, "put-large", self.rng.randint(1 << 20, self.large))

    def mpu(self, rec: KeyRecord) -> None:
        n = self.rng.randint(2, 3)
        size = PART * (n - 1) + self.rng.randint(1, PART)
        seq = self.journal.next_seq()
        recipe = (Piece(f"{rec.key}#{seq}", 0, size),)
        body = recipe[0].data()
        chunks = [body[i:i + PART] for i in range(0, size, PART)]
        v = self.journal.version("multipart", seq, recipe, etag=multipart_etag(chunks))
        up = self.s3.create_multipart_upload(Bucket=self.bucket, Key=rec.key)["UploadId"]
        parts = []
        for i, chunk in enumerate(chunks, 1):
            r = self.s3.upload_part(Bucket=self.bucket, Key=rec.key, UploadId=up,
                                    PartNumber=i, Body=chunk)
            parts.append({"PartNumber": i, "ETag": r["ETag"]})
        self.journal.begin(rec.key, v)  # only the Complete can change the key
        self.s3.complete_multipart_upload(Bucket=self.bucket, Key=rec.key, UploadId=up,
                                          MultipartUpload={"Parts": parts})
        self.journal.ack(rec.key, v, "multipart")

    def delete(self, rec: KeyRecord) -> None:
        v = self.journal.version("delete", self.journal.next_seq())
        self.journal.begin(rec.key, v)
        self.s3.delete_object(Bucket=self.bucket, Key=rec.key)
        self.journal.ack(rec.key, v, "delete")

    def copy(self, rec: KeyRecord) -> None:
        src = self.rng.choice(self.sources(rec))
        s = src.acked
        # a copy may keep a multipart source's ETag or take the MD5 of its bytes
        v = self.journal.version("copy", self.journal.next_seq(), s.recipe, raw=s.raw,
                                 alt_etag=s.etag)
        self.journal.begin(rec.key, v)
        self.s3.copy_object(Bucket=self.bucket, Key=rec.key,
                            CopySource={"Bucket": self.bucket, "Key": src.key})
        self.journal.ack(rec.key, v, "copy")


def s3_kill_hook(get_killer: Callable[[], Killer | None]) -> Callable[..., None]:
    """A botocore ``before-send`` handler: a mutating request is a kill point."""

    def hook(request: Any, **_: Any) -> None:
        killer = get_killer()
        if killer is not None and request.method in MUTATING:
            killer.point("s3-send")

    return hook


# -- FUSE --------------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes, pieces: int = 1) -> None:
    """Write ``data`` in ``pieces`` write calls (each retried until complete)."""
    step = max(1, -(-len(data) // pieces))
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        end = min(len(data), pos + step)
        while pos < end:
            pos += os.write(fd, view[pos:end])


class FuseWriter(Writer):
    """Real syscalls through the mount: create/in-place write + fsync, write-temp + fsync +
    rename over + directory fsync, O_APPEND + fsync, O_TRUNC + write + fsync, unlink +
    directory fsync."""

    kind = "fuse"

    def __init__(self, name: str, journal: Journal, keys: list[str], killer: Killer,
                 stop: threading.Event, seed: int, root: Path) -> None:
        super().__init__(name, journal, keys, killer, stop, seed)
        self.root = root  # the bucket's directory in the mount

    def path(self, key: str) -> Path:
        return self.root / key

    def pick(self, rec: KeyRecord) -> tuple[str, Callable[[KeyRecord], None]]:
        if rec.ambiguous:  # content unknown: only whole-content operations
            return self.choose([("rename-over", 1, self.rename_over),
                                ("trunc-write", 1, self.trunc_write),
                                ("unlink", 1, self.unlink)])
        small = rec.acked.present and rec.acked.size < FUSE_CAP
        return self.choose([
            ("write", 20, self.create if not rec.acked.present
             else self.write if small else self.trunc_write),
            ("rename-over", 20, self.rename_over),
            ("append", 20 if small or not rec.acked.present else 0, self.append),
            ("trunc-write", 20, self.trunc_write),
            ("unlink", 15 if rec.acked.present else 0, self.unlink)])

    def size(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.10:
            return self.rng.randint(FUSE_CAP // 2, 2 * FUSE_CAP)
        return self.rng.randint(1, 96 << 10)

    def create(self, rec: KeyRecord) -> None:
        """open(O_CREAT|O_EXCL) + write + fsync + close + directory fsync."""
        v = self.new_version("create", rec.key, self.size())
        empty = self.journal.version("create-empty", v.seq, ())
        self.journal.begin(rec.key, empty, v)
        fd = os.open(self.path(rec.key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, v.data(), self.rng.randint(1, 3))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.path(rec.key).parent)
        self.journal.ack(rec.key, v, "create")

    def write(self, rec: KeyRecord) -> None:
        """pwrite into the existing file (may extend it) + fsync: in flight, any byte-wise
        mix of the old and new content is acceptable."""
        old = rec.acked
        if old.recipe is None:  # an adopted content (no recipe): rewrite it whole instead
            return self.trunc_write(rec)
        seq = self.journal.next_seq()
        offset = self.rng.randint(0, old.size)
        piece = Piece(f"{rec.key}#{seq}", 0, self.rng.randint(1, 32 << 10))
        v = self.journal.version("write", seq, splice(old.recipe, offset, piece))
        self.journal.begin(rec.key, mix=(old, v))
        fd = os.open(self.path(rec.key), os.O_WRONLY)
        try:
            os.pwrite(fd, piece.data(), offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.journal.ack(rec.key, v, "write")

    def append(self, rec: KeyRecord) -> None:
        old = rec.acked
        if old.raw is not None:
            return self.trunc_write(rec)
        seq = self.journal.next_seq()
        piece = Piece(f"{rec.key}#{seq}", 0, self.rng.randint(1, 16 << 10))
        v = self.journal.version("append", seq, (*(old.recipe or ()), piece))
        if old.present:
            self.journal.begin(rec.key, v)
        else:  # O_CREAT made it: created empty is an outcome too
            self.journal.begin(rec.key, self.journal.version("append-empty", seq, ()), v)
        fd = os.open(self.path(rec.key), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            write_all(fd, piece.data())
            os.fsync(fd)
        finally:
            os.close(fd)
        if not old.present:
            fsync_dir(self.path(rec.key).parent)
        self.journal.ack(rec.key, v, "append")

    def trunc_write(self, rec: KeyRecord) -> None:
        """open(O_TRUNC) + write + fsync: in flight, the old, empty or new content."""
        created = not rec.acked.present or rec.ambiguous
        v = self.new_version("trunc-write", rec.key, self.size())
        empty = self.journal.version("trunc-empty", v.seq, ())
        self.journal.begin(rec.key, empty, v)
        fd = os.open(self.path(rec.key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.killer.point("fuse-ns")
            write_all(fd, v.data(), self.rng.randint(1, 2))
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.path(rec.key).parent)
        self.journal.ack(rec.key, v, "trunc-write")

    def rename_over(self, rec: KeyRecord) -> None:
        """Write ``KEY.tmp`` (O_TRUNC) + fsync, rename over ``KEY``, directory fsync."""
        tmp_key = rec.key + ".tmp"
        tmp = self.journal.records[tmp_key]
        v = self.new_version("rename-over", rec.key, self.size())
        empty = self.journal.version("tmp-empty", v.seq, ())
        gone = self.journal.version("renamed-away", v.seq)
        self.journal.begin(tmp_key, empty, v)
        fd = os.open(self.path(tmp_key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, v.data())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.journal.begin(tmp_key, gone)
        self.journal.begin(rec.key, v)
        os.rename(self.path(tmp_key), self.path(rec.key))
        self.killer.point("fuse-ns")
        fsync_dir(self.path(rec.key).parent)
        self.journal.ack(rec.key, v, "rename-over")
        self.journal.ack(tmp.key, gone)

    def unlink(self, rec: KeyRecord) -> None:
        maybe_absent = rec.ambiguous
        v = self.journal.version("unlink", self.journal.next_seq())
        self.journal.begin(rec.key, v)
        try:
            os.unlink(self.path(rec.key))
        except FileNotFoundError:
            if not maybe_absent:
                raise
        self.killer.point("fuse-ns")
        fsync_dir(self.path(rec.key).parent)
        self.journal.ack(rec.key, v, "unlink")
