"""The crash-torture harness's checker can fail: hand-made journals with wrong expectations,
deleted-but-present keys, torn writes, wrong ETags and a tampered cold store are reported.

A torture run that reports zero violations proves something only if the same checker reports
the violations it exists for.  The unit tests feed :mod:`torture_model` crafted journal states
and observations; :func:`test_harness_reports_a_tampered_namespace_and_cold_store` runs the
real harness (daemon, mount, both doors, the ``file://`` cold store) against a journal that
lies on purpose and a cold store changed behind the daemon's back.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from torture_model import (
    ZERO_RUN,
    Journal,
    Piece,
    Seen,
    Version,
    check_agree,
    check_cold,
    check_listing,
    check_read,
    multipart_etag,
    splice,
)


def content(tag: str, n: int) -> tuple[Piece, ...]:
    return (Piece(tag, 0, n),)


def journal_with(key: str, *acked: Version) -> Journal:
    j = Journal()
    j.key(key, "w")
    for v in acked:
        j.ack(key, v, v.label)
    return j


def kinds(violations: list) -> list[str]:  # type: ignore[type-arg]
    return [v.kind for v in violations]


def test_acknowledged_content_read_back_passes_and_settles() -> None:
    v = Version("put", 1, content("k#1", 1000))
    j = journal_with("k", v)
    matched, bad = check_read(j.records["k"], "s3", Seen(True, v.data(), etag=v.md5), 1)
    assert matched is v and bad == []


def test_wrong_expected_content_is_reported() -> None:
    """The journal expects seq 2's bytes; the door shows seq 1's (an older version)."""
    old = Version("put", 1, content("k#1", 1000))
    new = Version("put", 2, content("k#2", 1000))
    j = journal_with("k", old, new)
    matched, bad = check_read(j.records["k"], "s3", Seen(True, old.data(), etag=old.md5), 3)
    assert matched is None and kinds(bad) == ["stale"]
    assert bad[0].key == "k" and bad[0].cycle == 3 and bad[0].seen["md5"] == old.md5
    assert bad[0].expected[0]["md5"] == new.md5
    unknown = Version("put", 9, content("elsewhere", 1000))
    assert kinds(check_read(j.records["k"], "s3", Seen(True, unknown.data()), 3)[1]) == [
        "content"]


def test_lost_zeros_hang_and_errors_are_reported() -> None:
    v = Version("put", 1, content("k#1", 3 * ZERO_RUN))
    j = journal_with("k", v)
    rec = j.records["k"]
    assert kinds(check_read(rec, "fuse", Seen(False), 1)[1]) == ["lost"]
    torn = v.data()[:ZERO_RUN] + bytes(2 * ZERO_RUN)
    bad = check_read(rec, "fuse", Seen(True, torn), 1)[1]
    assert kinds(bad) == ["zeros"] and str(ZERO_RUN) in bad[0].detail
    assert kinds(check_read(rec, "s3", Seen(True, error="hang"), 1)[1]) == ["hang"]
    assert kinds(check_read(rec, "s3", Seen(True, error="GET: 10 of 99 bytes"), 1)[1]) == [
        "read-error"]


def test_deleted_key_present_is_a_resurrection_everywhere() -> None:
    put = Version("put", 1, content("k#1", 10))
    gone = Version("delete", 2)
    j = journal_with("k", put, gone)
    rec = j.records["k"]
    assert kinds(check_read(rec, "s3-head", Seen(True, etag=put.md5), 1)[1]) == [
        "resurrected"]
    assert kinds(check_read(rec, "fuse", Seen(True, put.data()), 1)[1]) == ["resurrected"]
    assert kinds(check_listing([rec], "s3-list", {"k": 10}, 1)) == ["listing-resurrected"]
    assert check_read(rec, "fuse", Seen(False), 1) == (gone, [])


def test_wrong_content_is_explained_in_terms_of_the_history() -> None:
    """A new file showing its unlinked predecessor's bytes before its own is named so."""
    j = Journal()
    j.key("k", "w")
    old = Version("rename-over", 5, content("k#5", 5085))
    new = Version("append", 9, content("k#9", 5005))
    j.ack("k", old, "rename-over")
    j.ack("k", Version("unlink", 7), "unlink")
    j.ack("k", new, "append")
    bad = check_read(j.records["k"], "fuse", Seen(True, old.data() + new.data()), 1)[1]
    assert kinds(bad) == ["content"]
    assert "[0,5085) rename-over#5 @0 [5085,10090) append#9 @0" in bad[0].detail


def test_in_flight_states_are_accepted_and_nothing_else() -> None:
    """An operation in flight at the kill: its old or new state (O_TRUNC: also empty)."""
    old = Version("put", 1, content("k#1", 100))
    j = journal_with("k", old)
    new = Version("trunc-write", 2, content("k#2", 50))
    empty = Version("trunc-empty", 2, ())
    j.begin("k", empty, new)
    rec = j.records["k"]
    for v in (old, new, empty):
        assert check_read(rec, "fuse", Seen(True, v.data()), 1) == (v, [])
    assert kinds(check_read(rec, "fuse", Seen(True, new.data()[:25]), 1)[1]) == ["content"]
    assert kinds(check_read(rec, "fuse", Seen(False), 1)[1]) == ["lost"]
    j.settle("k", new)
    assert kinds(check_read(rec, "fuse", Seen(True, old.data()), 2)[1]) == ["stale"]


def test_in_place_write_in_flight_allows_byte_mixes_only() -> None:
    old = Version("create", 1, content("k#1", 10000))
    j = journal_with("k", old)
    assert old.recipe is not None
    new = Version("write", 2, splice(old.recipe, 4000, Piece("k#2", 0, 8000)))
    j.begin("k", mix=(old, new))
    rec = j.records["k"]
    a, b = old.data(), new.data()
    mixed = b[:6000] + a[6000:]  # the first part of the write landed, the size did not
    matched, bad = check_read(rec, "fuse", Seen(True, mixed), 1)
    assert bad == [] and matched is not None and matched.data() == mixed
    assert check_read(rec, "fuse", Seen(True, b), 1)[1] == []
    wrong = bytearray(mixed)
    wrong[5000] = (a[5000] + 1) % 256 if (a[5000] + 1) % 256 != b[5000] else (a[5000] + 2) % 256
    assert kinds(check_read(rec, "fuse", Seen(True, bytes(wrong)), 1)[1]) == ["content"]
    past_old_end = a + bytes(len(b) - len(a))  # new size, zeros where only new bytes can be
    assert kinds(check_read(rec, "fuse", Seen(True, past_old_end), 1)[1]) == ["content"]


def test_etag_must_be_that_of_the_bytes() -> None:
    v = Version("put", 1, content("k#1", 100))
    j = journal_with("k", v)
    bad = check_read(j.records["k"], "s3", Seen(True, v.data(), etag="0" * 32), 1)[1]
    assert kinds(bad) == ["etag"] and bad[0].expected == [v.md5]
    parts = [b"a" * 300, b"b" * 10]
    mpu = Version("multipart", 2, content("k#2", 310), etag=multipart_etag(parts))
    j.ack("k", mpu, "multipart")
    data = mpu.data()
    assert check_read(j.records["k"], "s3", Seen(True, data, etag=mpu.etag), 1)[1] == []
    assert kinds(check_read(j.records["k"], "s3", Seen(True, data, etag=mpu.md5), 1)[1]) == [
        "etag"]


def test_doors_must_agree() -> None:
    a = Seen(True, b"one")
    assert check_agree("k", 1, {"s3": a, "fuse": Seen(True, b"one")}) == []
    assert kinds(check_agree("k", 1, {"s3": a, "fuse": Seen(True, b"two")})) == [
        "doors-disagree"]
    assert kinds(check_agree("k", 1, {"s3": a, "fuse": Seen(False)})) == ["doors-disagree"]


def test_listing_missing_extra_and_size() -> None:
    j = Journal()
    for k in ("a", "b", "c"):
        j.key(k, "w")
    j.ack("a", Version("put", 1, content("a#1", 5)), "put")
    j.ack("b", Version("put", 2, content("b#2", 7)), "put")
    recs = list(j.records.values())
    assert check_listing(recs, "s3-list", {"a": 5, "b": 7}, 1) == []
    bad = check_listing(recs, "s3-list", {"a": 6, "x/tmp": 1}, 1)
    assert sorted(kinds(bad)) == ["listing-extra", "listing-missing", "listing-size"]
    assert {v.key for v in bad} == {"a", "b", "x/tmp"}


def test_each_listing_agrees_with_its_own_door() -> None:
    import torture

    views = {"s3": Seen(True, b"12345", etag="e1"), "fuse": Seen(True, b"12345")}
    assert torture.same_as_listed("k", 1, views, {"k": (5, "e1")}, {"k": 5}) == []
    bad = torture.same_as_listed("k", 1, views, {"k": (4, "e2")}, {"k": 6})
    assert sorted((v.kind, v.door) for v in bad) == [
        ("listing-etag", "s3-list"), ("listing-size", "fuse-list"), ("listing-size", "s3-list")]


def test_cold_store_must_hold_exactly_the_live_keys() -> None:
    j = Journal()
    for k in ("live", "gone", "lost", "bad"):
        j.key(k, "w")
    live = Version("put", 1, content("live#1", 50))
    j.ack("live", live, "put")
    j.ack("gone", Version("delete", 2), "delete")
    j.ack("lost", Version("put", 3, content("lost#3", 9)), "put")
    bad = Version("put", 4, content("bad#4", 20))
    j.ack("bad", bad, "put")
    recs = list(j.records.values())
    good = {"live": Seen(True, live.data()), "bad": Seen(True, bad.data()),
            "lost": Seen(True, j.records["lost"].acked.data())}
    assert check_cold(recs, good, 1) == []
    cold = {"live": Seen(True, live.data()), "gone": Seen(True, b"old bytes"),
            "bad": Seen(True, bytes(20)), "stray.tmp": Seen(True, b"x")}
    found = {v.key: v.kind for v in check_cold(recs, cold, 1)}
    assert found == {"gone": "cold-resurrectable", "lost": "cold-missing",
                     "bad": "cold-content", "stray.tmp": "cold-extra"}
    assert check_cold(recs, {**good, "q": Seen(True, b"x")}, 1, frozenset({"q"})) == []


# -- the real harness against a lying journal -----------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no FUSE in this machine")
def test_harness_reports_a_tampered_namespace_and_cold_store(tmp_path: Path) -> None:
    import torture

    args = torture.parse_args(["--cold", "file", "--work-dir", str(tmp_path), "--keys", "3",
                               "--s3-writers", "1", "--fuse-writers", "1",
                               "--import-ttl", "0", "--read-timeout", "10",
                               "--evict-every", "0"])
    t = torture.Torture(args)
    j = t.journal
    try:
        t.setup()
        s3, root = t.s3, t.tierd.mnt / torture.BUCKET

        def put(key: str, v: Version) -> None:
            s3.put_object(Bucket=torture.BUCKET, Key=key, Body=v.data())

        right = j.version("put", j.next_seq(), content("right", 3000))
        wrong = j.version("put", j.next_seq(), content("wrong", 3000))
        put("s3/w0/k0", right)
        j.ack("s3/w0/k0", wrong, "put")                  # the journal expects other bytes
        (root / "f/w0/k0").write_bytes(b"never acknowledged")  # the journal says absent
        j.ack("s3/w0/k1", j.version("put", j.next_seq(), content("lost", 10)), "put")
        mpu = j.version("multipart", j.next_seq(), content("mpu", 100),
                        etag=multipart_etag([b"x", b"y"]))
        put("s3/w0/k2", mpu)                             # a single PUT: an MD5 ETag
        j.ack("s3/w0/k2", mpu, "multipart")
        t.verify(1, t.tierd.log_path)
        found = {(v.kind, v.door, v.key) for v in t.violations}
        assert {("content", "s3", "s3/w0/k0"), ("content", "fuse", "s3/w0/k0"),
                ("resurrected", "s3", "f/w0/k0"), ("resurrected", "fuse", "f/w0/k0"),
                ("listing-resurrected", "s3-list", "f/w0/k0"),
                ("listing-resurrected", "fuse-list", "f/w0/k0"),
                ("lost", "s3", "s3/w0/k1"), ("lost", "fuse", "s3/w0/k1"),
                ("listing-missing", "s3-list", "s3/w0/k1"),
                ("etag", "s3", "s3/w0/k2")} <= found, sorted(found)
        # the broken keys were deleted and now hold what the journal says: a clean pass
        t.violations.clear()
        good = j.version("put", j.next_seq(), content("good", 5000))
        put("s3/w0/k0", good)
        j.ack("s3/w0/k0", good, "put")
        t.verify(2, t.tierd.log_path)
        t.persist_and_check_cold(2, t.tierd.log_path)
        assert t.violations == []
        # the cold store changed behind the daemon's back
        cold = tmp_path / "cold" / torture.BUCKET
        (cold / "s3/w0/k0").unlink()
        (cold / "s3/w0/stray").write_bytes(b"nobody wrote this")
        t.persist_and_check_cold(3, t.tierd.log_path)
        cold_found = {(v.kind, v.door, v.key) for v in t.violations}
        assert {(k, key) for k, door, key in cold_found if door == "cold"} == {
            ("cold-missing", "s3/w0/k0"), ("cold-extra", "s3/w0/stray")}
        # the key whose cold copy is wrong is evicted and read again: the loss shows
        assert ("lost", "s3-evicted", "s3/w0/k0") in cold_found, cold_found
        assert {key for _, _, key in cold_found} == {"s3/w0/k0", "s3/w0/stray"}
    finally:
        t.tierd.stop()
