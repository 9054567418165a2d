"""The crash-torture harness's model: derivable contents, the journal of acknowledged
operations, and the checker that compares what the doors and the cold store show with it.

Nothing here does I/O, so the checker can be tested against hand-made journals
(``tests/durability/test_torture_checker.py``): a checker that cannot fail proves nothing.

**Contents.**  Every byte string a writer sends is derived from a tag (``"<key>#<seq>"``) by
SHAKE-128, so the journal keeps recipes and MD5s, never data, and any expected content can be
rebuilt to compare byte by byte.  A recipe is a tuple of :class:`Piece` (slices of such
streams): a PUT is one piece, an append adds one, an in-place write splices one in.

**Acknowledged vs in flight.**  Each key has one owner (a writer thread), so at most one
operation on it is in flight.  :meth:`Journal.begin` adds the states the operation may leave
(``pending``) before its first request or syscall; :meth:`Journal.ack` makes the new state the
acknowledged one once the S3 call returned success or the fsync (and the directory fsync of a
namespace change) returned.  An operation that failed in an unknown way keeps its states
pending until the next acknowledgement or the verification after a restart, which settles the
key on the state it found (:meth:`Journal.settle`).  A key whose state is ambiguous is only
written by whole-content operations (its old content is not known).

**Acceptable after a crash**: the acknowledged state or a pending one; for an in-place write
in flight (:attr:`KeyRecord.mixes`) any byte-wise mix of the old and new content, with the
old or the new size.  Anything else is a :class:`Violation`, classified by what it looks like
(``lost``, ``resurrected``, ``zeros``, ``stale``: an older version of the key, ``content``).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

#: a run of this many zero bytes in content that has none is reported as ``zeros``
ZERO_RUN = 4096
#: versions remembered per key, to name what a wrong read matches
HISTORY = 64


def iso(t: float) -> str:
    """Epoch seconds as UTC ISO 8601 with milliseconds (the daemon log's ``ts`` format)."""
    ms = round(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def stream(tag: str, n: int) -> bytes:
    """The first ``n`` bytes of the stream of ``tag`` (prefix-stable: a longer call starts
    with the bytes of a shorter one)."""
    return hashlib.shake_128(tag.encode()).digest(n) if n else b""


@dataclass(frozen=True)
class Piece:
    """``stream(tag)[off:off + n]``."""

    tag: str
    off: int
    n: int

    def data(self) -> bytes:
        return stream(self.tag, self.off + self.n)[self.off:]


Recipe = tuple[Piece, ...]


def cut(recipe: Recipe, start: int, end: int) -> Recipe:
    """The pieces of bytes ``[start, end)`` of ``recipe``."""
    out: list[Piece] = []
    pos = 0
    for p in recipe:
        lo, hi = max(start, pos), min(end, pos + p.n)
        if lo < hi:
            out.append(Piece(p.tag, p.off + lo - pos, hi - lo))
        pos += p.n
    return tuple(out)


def size_of(recipe: Recipe) -> int:
    return sum(p.n for p in recipe)


def splice(recipe: Recipe, offset: int, piece: Piece) -> Recipe:
    """``recipe`` with ``piece`` written at ``offset`` (at most at its end: no holes)."""
    total = size_of(recipe)
    assert 0 <= offset <= total
    return (*cut(recipe, 0, offset), piece, *cut(recipe, offset + piece.n, total))


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def multipart_etag(parts: Iterable[bytes]) -> str:
    """S3's ETag of a multipart object: the MD5 of the parts' MD5s, ``-N``."""
    digests = [hashlib.md5(p).digest() for p in parts]
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


@dataclass(frozen=True, eq=False)
class Version:
    """One state of a key: absent (no recipe, no raw) or a content.

    ``etag`` is the expected S3 ETag when it is not the MD5 of the content (a multipart
    upload); ``alt_etag`` another acceptable one (a copy may keep its source's ETag)."""

    label: str
    seq: int
    recipe: Recipe | None = None
    raw: bytes | None = None
    etag: str | None = None
    alt_etag: str | None = None
    cycle: int = 0

    @property
    def present(self) -> bool:
        return self.recipe is not None or self.raw is not None

    def data(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return b"".join(p.data() for p in self.recipe or ())

    @cached_property
    def size(self) -> int:
        if self.raw is not None:
            return len(self.raw)
        return size_of(self.recipe or ())

    @cached_property
    def md5(self) -> str | None:
        return md5_hex(self.data()) if self.present else None

    def etags(self, data: bytes) -> set[str]:
        """The ETags S3 may show for this version read back as ``data``."""
        if self.etag is not None:
            return {self.etag} | ({self.alt_etag} if self.alt_etag else set())
        return {md5_hex(data)} | ({self.alt_etag} if self.alt_etag else set())

    def describe(self) -> dict[str, Any]:
        return {"op": self.label, "seq": self.seq, "cycle": self.cycle,
                "present": self.present, "size": self.size if self.present else None,
                "md5": self.md5}


def absent(label: str = "initial", seq: int = 0, cycle: int = 0) -> Version:
    return Version(label, seq, cycle=cycle)


@dataclass
class KeyRecord:
    """What the journal knows about one key."""

    key: str
    owner: str
    acked: Version = field(default_factory=absent)
    pending: list[Version] = field(default_factory=list)
    #: in-place writes in flight: any byte-wise mix of (old, new) is acceptable
    mixes: list[tuple[Version, Version]] = field(default_factory=list)
    history: deque[Version] = field(default_factory=lambda: deque(maxlen=HISTORY))
    #: (label, seq) of the versions acknowledged, newest last
    acked_log: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    #: why the key is no longer written or checked (a read that hung, ...), or None
    quarantined: str | None = None

    @property
    def ambiguous(self) -> bool:
        """Whether the key's content is not known for sure (an operation's outcome)."""
        return bool(self.pending or self.mixes)

    def ops_doc(self, n: int = 12) -> list[dict[str, Any]]:
        """The key's last ``n`` versions begun, each marked acknowledged or not."""
        acked = set(self.acked_log)
        return [{**v.describe(), "acked": (v.label, v.seq) in acked}
                for v in list(self.history)[-n:]]

    def candidates(self) -> list[Version]:
        return [self.acked, *self.pending]

    def may_be_present(self) -> bool:
        return any(v.present for v in self.candidates()) or bool(self.mixes)

    def may_be_absent(self) -> bool:
        return any(not v.present for v in self.candidates())


@dataclass
class Seen:
    """What one door (or the cold store) showed for a key."""

    present: bool
    data: bytes | None = None
    etag: str | None = None
    #: the read failed: ``hang`` (timed out) or the error; data is then None
    error: str | None = None
    #: when the object was written (cold store: file mtime / LastModified), epoch seconds
    written: float | None = None

    @cached_property
    def md5(self) -> str | None:
        return None if self.data is None else md5_hex(self.data)

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"present": self.present}
        if self.error:
            doc["error"] = self.error
        if self.data is not None:
            doc.update(size=len(self.data), md5=self.md5)
        if self.etag is not None:
            doc["etag"] = self.etag
        if self.written is not None:
            doc["written"] = iso(self.written)
        return doc


@dataclass
class Violation:
    """One broken invariant; ``log`` is filled by the harness (daemon log lines)."""

    kind: str
    key: str
    door: str
    cycle: int
    expected: Any
    seen: Any
    detail: str = ""
    #: filled by the harness: how the cycle's kill came, the key's last operations, and
    #: daemon log lines around it
    kill: str = ""
    ops: list[dict[str, Any]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Journal:
    """Every key's acknowledged and pending states (thread-safe: writers run concurrently).

    ``acked_ops`` counts acknowledged operations per kind; ``entries`` is the append-only log
    of acknowledgements (key, kind, seq, size, md5) that the harness writes out."""

    def __init__(self) -> None:
        self.records: dict[str, KeyRecord] = {}
        self.acked_ops: Counter[str] = Counter()
        self.entries: list[dict[str, Any]] = []
        self.cycle = 0
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def key(self, key: str, owner: str) -> KeyRecord:
        with self._lock:
            rec = self.records.get(key)
            if rec is None:
                rec = self.records[key] = KeyRecord(key, owner)
            return rec

    def next_seq(self) -> int:
        with self._lock:
            return next(self._seq)

    def version(self, label: str, seq: int, recipe: Recipe | None = None,
                **kw: Any) -> Version:
        return Version(label, seq, recipe, cycle=self.cycle, **kw)

    def begin(self, key: str, *versions: Version,
              mix: tuple[Version, Version] | None = None) -> None:
        """The states an operation about to start may leave ``key`` in."""
        with self._lock:
            rec = self.records[key]
            rec.pending.extend(versions)
            rec.history.extend(versions)
            if mix is not None:
                rec.mixes.append(mix)
                rec.history.append(mix[1])

    def ack(self, key: str, version: Version, kind: str | None = None) -> None:
        """``version`` is acknowledged: the only acceptable state until the next operation."""
        with self._lock:
            self._set(key, version)
            self.records[key].acked_log.append((version.label, version.seq))
            if kind is not None:
                self.acked_ops[kind] += 1
            self.entries.append({"cycle": self.cycle, "key": key, "op": kind or version.label,
                                 "seq": version.seq, "size": version.size if version.present
                                 else None, "md5": version.md5})

    def settle(self, key: str, version: Version) -> None:
        """After a restart: the key was found in ``version`` (one of its acceptable
        states, or what a violation showed); that is its state from now on."""
        with self._lock:
            self._set(key, version)

    def _set(self, key: str, version: Version) -> None:
        rec = self.records[key]
        rec.acked = version
        rec.pending.clear()
        rec.mixes.clear()
        if version not in rec.history:
            rec.history.append(version)

    def quarantine(self, key: str, why: str) -> None:
        with self._lock:
            self.records[key].quarantined = why

    def live(self) -> list[KeyRecord]:
        """Records still checked."""
        with self._lock:
            return [r for r in self.records.values() if r.quarantined is None]


# -- the checker -------------------------------------------------------------------------------


def is_mix(old: Version, new: Version, data: bytes) -> bool:
    """Whether ``data`` is a byte-wise mix of ``old`` and ``new`` with one of their sizes
    (bytes past the old end can only be the new bytes)."""
    if len(data) not in (old.size, new.size):
        return False
    a, b = old.data(), new.data()
    for i in range(0, len(data), 65536):
        chunk = data[i:i + 65536]
        if chunk in (a[i:i + 65536], b[i:i + 65536]):
            continue
        for j, c in enumerate(chunk, i):
            if not ((j < len(a) and a[j] == c) or (j < len(b) and b[j] == c)):
                return False
    return True


def match(rec: KeyRecord, seen: Seen) -> Version | None:
    """The acceptable state ``seen`` is, or None."""
    if seen.error is not None:
        return None
    for v in rec.candidates():
        if not v.present and not seen.present:
            return v
        if (v.present and seen.present and seen.data is not None
                and v.size == len(seen.data) and v.md5 == seen.md5):
            return v
    if seen.present and seen.data is not None:
        for old, new in rec.mixes:
            if is_mix(old, new, seen.data):
                return Version("mix", new.seq, raw=seen.data, cycle=new.cycle)
    return None


def zero_run(data: bytes) -> int | None:
    """Offset of the first run of :data:`ZERO_RUN` zero bytes, or None."""
    at = data.find(bytes(ZERO_RUN))
    return None if at < 0 else at


def expected_doc(rec: KeyRecord) -> list[dict[str, Any]]:
    docs = [{"state": "acked", **rec.acked.describe()}]
    docs += [{"state": "in-flight", **v.describe()} for v in rec.pending]
    docs += [{"state": "in-flight mix", "old": o.describe(), "new": n.describe()}
             for o, n in rec.mixes]
    return docs


def diagnose(rec: KeyRecord, seen: Seen) -> tuple[str, str]:
    """(kind, detail) of a read that matched no acceptable state."""
    if seen.error is not None:
        return ("hang" if seen.error == "hang" else "read-error"), seen.error
    if not seen.present:
        return "lost", "an acknowledged content is gone"
    if not rec.may_be_present():
        return "resurrected", "the key was deleted (acknowledged) and is back"
    assert seen.data is not None
    for v in reversed(rec.history):
        if v.present and v.size == len(seen.data) and v.md5 == seen.md5:
            return "stale", f"matches an older version: {v.label} seq {v.seq} cycle {v.cycle}"
    expected_zero = any(v.present and zero_run(v.data()) is not None
                        for v in rec.candidates())
    at = zero_run(seen.data)
    shape = f"; {len(seen.data)} bytes: {layout(rec, seen.data)}"
    if at is not None and not expected_zero:
        return "zeros", f"{ZERO_RUN} zero bytes at offset {at}{shape}"
    return "content", f"matches no version the journal knows{shape}"


def _common(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n, step = 0, 4096
    limit = min(len(a), len(b))
    while n < limit:
        m = min(step, limit - n)
        if a[n:n + m] == b[n:n + m]:
            n += m
            continue
        while a[n] == b[n]:
            n += 1
        break
    return n


def layout(rec: KeyRecord, data: bytes, most: int = 10) -> str:
    """What ``data`` is made of, in terms of the key's history: ``[start,end) op#seq
    @offset`` for runs of a version's stream, ``zeros``, ``unknown`` -- e.g. a new file whose
    first bytes are an unlinked predecessor's."""
    names: dict[str, str] = {}
    ends: dict[str, int] = {}
    for v in rec.history:
        for p in v.recipe or ():
            names.setdefault(p.tag, f"{v.label}#{v.seq}" if p.tag.endswith(f"#{v.seq}")
                             else p.tag)
            ends[p.tag] = max(ends.get(p.tag, 0), p.off + p.n)
    streams = {tag: stream(tag, n) for tag, n in ends.items()}
    segs: list[str] = []
    pos = 0
    unknown: int | None = None  # start of a run nothing known matches

    def flush() -> None:
        nonlocal unknown
        if unknown is not None:
            segs.append(f"[{unknown},{pos}) unknown")
            unknown = None

    while pos < len(data) and len(segs) < most:
        probe = data[pos:pos + 32]
        if not probe.strip(b"\0"):
            flush()
            end = len(data) - len(data[pos:].lstrip(b"\0"))
            segs.append(f"[{pos},{end}) zeros")
            pos = end
            continue
        for tag, body in streams.items():
            at = body.find(probe)
            if at >= 0:
                flush()
                n = _common(data[pos:], body[at:])
                segs.append(f"[{pos},{pos + n}) {names[tag]} @{at}")
                pos += n
                break
        else:
            if unknown is None:
                unknown = pos
            pos = min(len(data), (pos // 4096 + 1) * 4096)
    flush()
    return " ".join(segs) + (" ..." if pos < len(data) else "")


def check_read(rec: KeyRecord, door: str, seen: Seen, cycle: int,
               check_etag: bool = True) -> tuple[Version | None, list[Violation]]:
    """One door's read of one key: the state it matched and the violations (content, then
    the ETag against the bytes)."""
    v = match(rec, seen)
    if v is None:
        kind, detail = diagnose(rec, seen)
        return None, [Violation(kind, rec.key, door, cycle, expected_doc(rec),
                                seen.describe(), detail)]
    out: list[Violation] = []
    if check_etag and v.present and seen.data is not None and seen.etag is not None:
        ok = v.etags(seen.data)
        if seen.etag not in ok:
            out.append(Violation("etag", rec.key, door, cycle, sorted(ok), seen.describe(),
                                 f"ETag is not that of the bytes served ({v.label} "
                                 f"seq {v.seq})"))
    return v, out


#: violations of a state that stays wrong until the key changes: reported once, and the
#: key is kept (its content is right) so later checks (the cold copy) see what follows
LASTING = frozenset({"etag", "listing-etag"})


def check_agree(key: str, cycle: int, views: Mapping[str, Seen]) -> list[Violation]:
    """The doors must show the same thing for a key (present or not, same bytes)."""
    shown = {door: (s.present, s.md5) for door, s in views.items() if s.error is None}
    if len(set(shown.values())) <= 1:
        return []
    return [Violation("doors-disagree", key, "+".join(sorted(shown)), cycle, None,
                      {d: views[d].describe() for d in sorted(shown)},
                      "S3 and FUSE show different states")]


def check_listing(records: Iterable[KeyRecord], door: str, listed: Mapping[str, int],
                  cycle: int, prefix: str = "") -> list[Violation]:
    """A listing (key -> size) against the journal: every key that must be present is
    listed with one of its sizes, and nothing else under ``prefix`` is."""
    out: list[Violation] = []
    known: set[str] = set()
    for rec in records:
        known.add(rec.key)
        size = listed.get(rec.key)
        if size is None:
            if not rec.may_be_absent():
                out.append(Violation("listing-missing", rec.key, door, cycle,
                                     expected_doc(rec), None, "a present key is not listed"))
        elif not rec.may_be_present():
            out.append(Violation("listing-resurrected", rec.key, door, cycle,
                                 expected_doc(rec), {"size": size},
                                 "a deleted key is listed"))
        elif not rec.mixes and size not in {v.size for v in rec.candidates() if v.present}:
            out.append(Violation("listing-size", rec.key, door, cycle, expected_doc(rec),
                                 {"size": size}, "listed with a size of no acceptable state"))
    for key in sorted(set(listed) - known):
        if key.startswith(prefix):
            out.append(Violation("listing-extra", key, door, cycle, None,
                                 {"size": listed[key]}, "a key nobody wrote is listed"))
    return out


def check_cold(records: Iterable[KeyRecord], cold: Mapping[str, Seen], cycle: int,
               ignore: frozenset[str] = frozenset()) -> list[Violation]:
    """After persist-and-wait (no writer running, every key settled): cold holds exactly the
    present keys, each with its acknowledged bytes.  ``ignore``: quarantined keys."""
    out: list[Violation] = []
    known: set[str] = set()
    for rec in records:
        known.add(rec.key)
        seen = cold.get(rec.key, Seen(False))
        want = rec.acked
        if want.present and not seen.present:
            out.append(Violation("cold-missing", rec.key, "cold", cycle, want.describe(),
                                 None, "persisted, yet not in the cold store"))
        elif not want.present and seen.present:
            out.append(Violation("cold-resurrectable", rec.key, "cold", cycle,
                                 want.describe(), seen.describe(),
                                 "deleted, yet still in the cold store"))
        elif want.present and seen.md5 != want.md5:
            kind, detail = diagnose(rec, seen)
            out.append(Violation("cold-" + kind, rec.key, "cold", cycle, want.describe(),
                                 seen.describe(), detail))
    for key in sorted(set(cold) - known - ignore):
        out.append(Violation("cold-extra", key, "cold", cycle, None, cold[key].describe(),
                             "an object nobody wrote (a temporary or renamed-away key?)"))
    return out
