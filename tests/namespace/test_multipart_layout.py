"""Where multipart parts are written (tierd/namespace/mpu_parts.py) and how Complete uses
that: parts in their slots of the upload's data file complete without a copy (the data file
*becomes* the object), every other layout is copied, and no layout changes what the object
holds.  Races are driven deterministically with bodies the test releases by hand."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tierd.errors import Reason
from tierd.namespace import FsError
from tierd.namespace.mpu_parts import DATA, Payload

from .conftest import ROOT, NsEnv

S = 64  # the slot size the tests' first parts set (min_part_size is lowered to 16)


@pytest.fixture
def env(nsenv: NsEnv) -> NsEnv:
    nsenv.ns.min_part_size = 16
    nsenv.run(nsenv.ns.create_bucket(ROOT, "bkt"))
    return nsenv


async def gen(data: bytes, step: int = 7) -> AsyncIterator[bytes]:
    for i in range(0, len(data), step):
        yield data[i:i + step]


def body(data: bytes) -> Payload:
    return Payload(gen(data), len(data))


def mpu_etag(parts: list[bytes]) -> str:
    return hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + \
        f"-{len(parts)}"


def start(env: NsEnv, key: str = "k") -> str:
    return env.run(env.ns.create_multipart(ROOT, "bkt", key)).upload_id


def put_part(env: NsEnv, uid: str, n: int, data: bytes, sized: bool = True) -> str:
    src = body(data) if sized else gen(data)
    return env.run(env.ns.upload_part(ROOT, uid, n, src)).etag


def complete(env: NsEnv, uid: str, listed: list[tuple[int, str]]) -> int:
    return env.run(env.ns.complete_multipart(ROOT, uid, listed)).ino


def data_ino(env: NsEnv, uid: str) -> int:
    """The inode of the upload's data file (-1: none was needed)."""
    path = Path(env.ns.hot.root) / "mpu" / uid / DATA
    return path.stat().st_ino if path.exists() else -1


def hot_ino(env: NsEnv, ino: int) -> int:
    return os.stat(env.ns.hot.path(ino)).st_ino


def test_fixed_size_parts_in_any_order_complete_without_copy(env: NsEnv) -> None:
    parts = [os.urandom(S), os.urandom(S), os.urandom(S), os.urandom(10)]
    uid = start(env)
    etags = {n: put_part(env, uid, n, parts[n - 1]) for n in (2, 4, 1, 3)}  # 4: tail, early
    before = data_ino(env, uid)
    ino = complete(env, uid, sorted(etags.items()))
    assert hot_ino(env, ino) == before  # the data file became the object: nothing copied
    assert env.get(ROOT, "bkt", "k") == b"".join(parts)
    assert env.run(env.ns.head_object(ROOT, "bkt", "k")).etag == mpu_etag(parts)
    assert not (Path(env.ns.hot.root) / "mpu" / uid).exists()


def test_short_first_part_does_not_set_the_slot_size(env: NsEnv) -> None:
    """A client's short last part may arrive first: only a part of at least the minimum
    size (or part 1) sets the layout."""
    parts = [os.urandom(S), os.urandom(S), os.urandom(5)]
    uid = start(env)
    e3 = put_part(env, uid, 3, parts[2])
    e1 = put_part(env, uid, 1, parts[0])
    e2 = put_part(env, uid, 2, parts[1])
    before = data_ino(env, uid)
    ino = complete(env, uid, [(1, e1), (2, e2), (3, e3)])
    assert hot_ino(env, ino) == before
    assert env.get(ROOT, "bkt", "k") == b"".join(parts)


@pytest.mark.parametrize("layout", ["bigger", "uneven", "unsized", "gap"])
def test_other_layouts_are_copied(env: NsEnv, layout: str) -> None:
    sizes = {"bigger": [S, S + 9, 3], "uneven": [S, 40, 3], "unsized": [S, S, 3],
             "gap": [S, S, 3]}[layout]
    parts = [os.urandom(n) for n in sizes]
    uid = start(env)
    numbers = [1, 3, 4] if layout == "gap" else [1, 2, 3]
    listed = [(n, put_part(env, uid, n, p, sized=layout != "unsized"))
              for n, p in zip(numbers, parts, strict=True)]
    before = data_ino(env, uid)
    ino = complete(env, uid, listed)
    assert hot_ino(env, ino) != before
    assert env.get(ROOT, "bkt", "k") == b"".join(parts)
    assert env.run(env.ns.head_object(ROOT, "bkt", "k")).etag == mpu_etag(parts)


def test_reupload_goes_beside_the_acknowledged_part(env: NsEnv) -> None:
    p1, old, new = os.urandom(S), os.urandom(S), os.urandom(S)
    uid = start(env)
    e1 = put_part(env, uid, 1, p1)
    e_old = put_part(env, uid, 2, old)
    # a re-upload that fails midway leaves the acknowledged part as it was
    async def broken() -> AsyncIterator[bytes]:
        yield new[:30]
        raise FsError(5, "client went away")
    with pytest.raises(FsError):
        env.run(env.ns.upload_part(ROOT, uid, 2, Payload(broken(), S)))
    _, listed, _ = env.run(env.ns.list_parts(ROOT, uid))
    assert [p.etag for p in listed] == [e1, e_old]
    e_new = put_part(env, uid, 2, new)
    env.err(22, env.ns.complete_multipart(ROOT, uid, [(1, e1), (2, e_old)]))  # replaced
    complete(env, uid, [(1, e1), (2, e_new)])
    assert env.get(ROOT, "bkt", "k") == p1 + new


def test_unlisted_parts_beyond_the_object(env: NsEnv) -> None:
    """Bytes past the listed parts are cut (zero copy) only if no stored part is there;
    otherwise the object is copied and the upload's parts stay intact until the commit."""
    p = [os.urandom(S) for _ in range(3)]
    uid = start(env)
    e = [put_part(env, uid, n, p[n - 1]) for n in (1, 2, 3)]
    before = data_ino(env, uid)
    ino = complete(env, uid, [(1, e[0]), (2, e[1])])
    assert hot_ino(env, ino) != before and env.get(ROOT, "bkt", "k") == p[0] + p[1]

    uid = start(env, "k2")
    e = [put_part(env, uid, n, p[n - 1]) for n in (1, 2)]

    async def garbage() -> AsyncIterator[bytes]:  # part 3 dies after writing its slot
        yield os.urandom(S - 1)
        raise FsError(5, "client went away")
    with pytest.raises(FsError):
        env.run(env.ns.upload_part(ROOT, uid, 3, Payload(garbage(), S)))
    before = data_ino(env, uid)
    ino = complete(env, uid, [(1, e[0]), (2, e[1])])
    assert hot_ino(env, ino) == before and env.get(ROOT, "bkt", "k2") == p[0] + p[1]
    assert os.stat(env.ns.hot.path(ino)).st_size == 2 * S


def test_complete_pauses_a_part_in_flight(env: NsEnv) -> None:
    """A part streaming into its slot while Complete links the data file must not write
    into the object: it waits, and fails with NoSuchUpload once the upload is complete."""
    p1, p2, p3 = os.urandom(S), os.urandom(S), os.urandom(S)
    uid = start(env)
    e1, e2 = put_part(env, uid, 1, p1), put_part(env, uid, 2, p2)
    release = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield p3[:S // 2]
        await release.wait()
        yield p3[S // 2:]

    async def race() -> tuple[BaseException | None, int]:
        writer = asyncio.ensure_future(env.ns.upload_part(ROOT, uid, 3, Payload(slow(), S)))
        for _ in range(20):  # let the writer put its first half into slot 3
            await asyncio.sleep(0.01)
        done = asyncio.ensure_future(env.ns.complete_multipart(ROOT, uid, [(1, e1), (2, e2)]))
        await asyncio.sleep(0.05)
        release.set()
        inode = await done
        try:
            await writer
        except FsError as e:
            return e, inode.ino
        return None, inode.ino

    err, ino = env.run(race())
    assert isinstance(err, FsError) and err.reason is Reason.NO_SUCH_UPLOAD
    assert env.get(ROOT, "bkt", "k") == p1 + p2
    assert os.stat(env.ns.hot.path(ino)).st_size == 2 * S


def test_failed_complete_lets_paused_parts_go_on(env: NsEnv) -> None:
    p1, p2 = os.urandom(S), os.urandom(S)
    uid = start(env)
    e1 = put_part(env, uid, 1, p1)
    release = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield p2[:10]
        await release.wait()
        yield p2[10:]

    async def race() -> str:
        writer = asyncio.ensure_future(env.ns.upload_part(ROOT, uid, 2, Payload(slow(), S)))
        await asyncio.sleep(0.05)
        st = env.ns._parts.state(uid, [])
        st.pause()  # what a Complete does; then it fails and resumes
        release.set()
        await asyncio.sleep(0.05)
        assert not writer.done()  # waiting, not writing
        st.resume()
        return (await writer).etag

    e2 = env.run(race())
    complete(env, uid, [(1, e1), (2, e2)])
    assert env.get(ROOT, "bkt", "k") == p1 + p2


def test_concurrent_uploads_of_one_part_number(env: NsEnv) -> None:
    p1 = os.urandom(S)
    bodies = [os.urandom(S) for _ in range(4)]
    uid = start(env)
    e1 = put_part(env, uid, 1, p1)

    async def all_at_once() -> list[str]:
        parts = await asyncio.gather(*(env.ns.upload_part(ROOT, uid, 2, body(b))
                                       for b in bodies))
        return [p.etag for p in parts]

    etags = env.run(all_at_once())
    _, listed, _ = env.run(env.ns.list_parts(ROOT, uid))
    winner = listed[1].etag
    assert winner in etags
    complete(env, uid, [(1, e1), (2, winner)])
    assert env.get(ROOT, "bkt", "k") == p1 + bodies[etags.index(winner)]
    assert not (Path(env.ns.hot.root) / "mpu" / uid).exists()


def test_a_slot_claim_never_sees_a_record_from_before_a_commit(env: NsEnv) -> None:
    """The slot claim reads the part's record in an asynchronous snapshot.  A (in the
    slot) finishes and commits its record while B's read is in flight: B must not then
    take the slot (A's acknowledged bytes), write it and be refused."""
    p1, pa = os.urandom(S), os.urandom(S)
    uid = start(env)
    e1 = put_part(env, uid, 1, p1)
    release, reading = asyncio.Event(), asyncio.Event()
    meta = env.ns.meta
    plain = meta.asnapshot
    b_reads: list[asyncio.Task[object] | None] = []

    @contextlib.asynccontextmanager
    async def slow_snapshot() -> AsyncIterator[object]:
        async with plain() as tx:
            yield tx
        if b_reads and asyncio.current_task() is b_reads[0]:
            b_reads.append(None)
            if len(b_reads) == 3:  # B's second read (the upload's, then the claim's)
                reading.set()
                await asyncio.sleep(0.2)

    async def a_body() -> AsyncIterator[bytes]:
        yield pa[:10]
        await release.wait()
        yield pa[10:]

    def bad_digest() -> None:  # B's bytes are all written, then refused
        raise OSError(errno.EBADMSG, "the payload's checksum does not match")

    async def race() -> str:
        a = asyncio.ensure_future(env.ns.upload_part(ROOT, uid, 2, Payload(a_body(), S)))
        await asyncio.sleep(0.05)
        b = asyncio.ensure_future(env.ns.upload_part(
            ROOT, uid, 2, Payload(gen(b"B" * S), S, verify=bad_digest)))
        b_reads.append(b)  # type: ignore[arg-type]
        await reading.wait()
        release.set()  # A completes while B's claim waits for its read
        with pytest.raises(OSError):
            await b
        return (await a).etag

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(meta, "asnapshot", slow_snapshot)
        ea = env.run(race())
    complete(env, uid, [(1, e1), (2, ea)])
    assert env.get(ROOT, "bkt", "k") == p1 + pa


def test_upload_part_copy_uses_slots(env: NsEnv) -> None:
    src = os.urandom(3 * S)
    env.put(ROOT, "bkt", "src", src)
    uid = start(env)
    parts = []
    for n in (1, 2, 3):
        first = (n - 1) * S
        part = env.run(env.ns.upload_part_copy(ROOT, uid, n, "bkt", "src",
                                               (first, first + S - 1)))
        assert part.etag == hashlib.md5(src[first:first + S]).hexdigest()
        parts.append((n, part.etag))
    before = data_ino(env, uid)
    ino = complete(env, uid, parts)
    assert hot_ino(env, ino) == before and env.get(ROOT, "bkt", "k") == src


def test_abort_and_parts_after_it(env: NsEnv) -> None:
    uid = start(env)
    put_part(env, uid, 1, os.urandom(S))
    env.run(env.ns.abort_multipart(ROOT, uid))
    assert not (Path(env.ns.hot.root) / "mpu" / uid).exists()
    env.err(2, env.ns.upload_part(ROOT, uid, 2, body(os.urandom(S))))
    env.err(2, env.ns.head_object(ROOT, "bkt", "k"))


def test_restart_keeps_parts_and_the_slot_size(env: NsEnv) -> None:
    """After a crash: acknowledged parts are there, the slot size comes back from their
    records (so new parts still complete without a copy), the incomplete upload is no
    object, and files no record names are removed."""
    p = [os.urandom(S) for _ in range(3)]
    uid = start(env)
    e1, e2 = put_part(env, uid, 1, p[0]), put_part(env, uid, 2, p[1])
    stray = Path(env.ns.hot.root) / "mpu" / uid / "p7-0123456789abcdef"
    stray.write_bytes(b"left by a crash")
    gone = Path(env.ns.hot.root) / "mpu" / "no-such-upload"
    gone.mkdir()
    env.crash_reopen()
    env.ns.min_part_size = 16
    assert not stray.exists() and not gone.exists()
    env.err(2, env.ns.head_object(ROOT, "bkt", "k"))
    e3 = put_part(env, uid, 3, p[2])
    before = data_ino(env, uid)
    ino = complete(env, uid, [(1, e1), (2, e2), (3, e3)])
    assert hot_ino(env, ino) == before and env.get(ROOT, "bkt", "k") == b"".join(p)


def test_concurrent_completes(env: NsEnv) -> None:
    """Two Completes of one upload (even with different part lists): one wins, the other is
    NoSuchUpload, and the object holds exactly the winner's parts."""
    p = [os.urandom(S), os.urandom(S), os.urandom(9)]
    uid = start(env)
    e = [put_part(env, uid, n, p[n - 1], sized=n < 3) for n in (1, 2, 3)]

    async def both() -> list[object]:
        return await asyncio.gather(
            env.ns.complete_multipart(ROOT, uid, [(1, e[0]), (2, e[1])]),
            env.ns.complete_multipart(ROOT, uid, [(1, e[0]), (2, e[1]), (3, e[2])]),
            return_exceptions=True)

    first, second = env.run(both())
    assert isinstance(second, FsError) and second.reason is Reason.NO_SUCH_UPLOAD
    assert not isinstance(first, BaseException)
    assert env.get(ROOT, "bkt", "k") == p[0] + p[1]
    assert os.stat(env.ns.hot.path(first.ino)).st_size == 2 * S  # type: ignore[attr-defined]


def test_parts_recorded_before_slots_existed(env: NsEnv) -> None:
    """An upload in flight across the upgrade: its part records have no location, and the
    bytes are in a file named after the part number.  They survive a restart's cleanup and
    complete (by copying) with parts written since."""
    from tierd.meta import UploadPart

    p1, p2 = os.urandom(S), os.urandom(20)
    uid = start(env)
    e1 = put_part(env, uid, 1, p1, sized=False)  # an own file, like the old layout
    legacy = Path(env.ns.hot.root) / "mpu" / uid / "2"
    legacy.write_bytes(p2)
    e2 = hashlib.md5(p2).hexdigest()
    with env.ns.meta.write() as tx:
        tx.put_part(uid, UploadPart(2, e2, len(p2), 1))
    env.run(env.ns._sync_meta())
    env.crash_reopen()
    env.ns.min_part_size = 16
    assert legacy.exists()
    complete(env, uid, [(1, e1), (2, e2)])
    assert env.get(ROOT, "bkt", "k") == p1 + p2
