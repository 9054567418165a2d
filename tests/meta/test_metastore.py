"""MetaStore (tierd/meta/store.py) and its records, run unchanged against every engine."""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierd.meta import (
    SCHEMA_VERSION,
    STATE_CLEAN,
    AccessKey,
    Bucket,
    Dirent,
    Inode,
    MetaStore,
    MetaTxn,
    MultipartUpload,
    SchemaError,
    UploadPart,
)
from tierd.meta.kv import KVStore
from tierd.meta.records import Record

from .conftest import EngineFactory

PROPS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

S_IFREG, S_IFDIR, S_IFLNK = stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK
MAX_U64 = 2**64 - 1


def reg(ino: int, size: int = 0, **kw: Any) -> Inode:
    return Inode(ino=ino, mode=S_IFREG | 0o644, uid=1000, gid=1000, size=size, **kw)


def dir_inode(ino: int, **kw: Any) -> Inode:
    return Inode(ino=ino, mode=S_IFDIR | 0o755, uid=0, gid=0, size=4096, nlink=2, **kw)


# -- schema -----------------------------------------------------------------------------------


def test_schema_record_created(engine: KVStore) -> None:
    store = MetaStore(engine)
    assert store.schema_version() == SCHEMA_VERSION
    tx = engine.begin()
    assert msgpack.unpackb(tx.get(b"\x00schema")) == SCHEMA_VERSION
    # the schema record is all a new store holds
    assert [k for k, _ in tx.scan(b"")] == [b"\x00schema"]
    tx.abort()


def test_schema_checked_on_reopen(engines: EngineFactory) -> None:
    engine = engines.new()
    store = MetaStore(engine)
    with store.write() as tx:
        tx.put_inode(reg(5, 10))
    engine = engines.reopen(engine)
    store = MetaStore(engine)  # same version: opens, keeps the data
    assert store.schema_version() == SCHEMA_VERSION
    with store.read() as tx:
        assert tx.get_inode(5) == reg(5, 10)


@pytest.mark.parametrize("found", [SCHEMA_VERSION + 1, 0, 99])
def test_schema_mismatch_raises(engines: EngineFactory, found: int) -> None:
    engine = engines.new()
    MetaStore(engine)
    with engine.begin(write=True) as tx:
        tx.put(b"\x00schema", msgpack.packb(found))
    engine = engines.reopen(engine)
    with pytest.raises(SchemaError, match=f"version {found} is not supported"):
        MetaStore(engine)
    # the check neither rewrote the record nor left the writer locked
    with engine.begin(write=True) as tx:
        assert msgpack.unpackb(tx.get(b"\x00schema")) == found


# -- transactions -----------------------------------------------------------------------------


def test_metatxn_commit_abort_and_exception(store: MetaStore) -> None:
    with store.write() as tx:
        assert tx.write
        tx.put_inode(reg(2, 1))
    tx = store.write()
    tx.put_inode(reg(3, 1))
    tx.abort()
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.put_inode(reg(4, 1))
        raise RuntimeError("boom")
    with store.read() as tx:
        assert not tx.write
        assert [i.ino for i in tx.iter_inodes()] == [2]
        assert tx.counter("inodes") == 1


def test_snapshot_is_read_only_and_isolated(store: MetaStore) -> None:
    with store.write() as tx:
        tx.put_inode(reg(2, 1))
    with store.snapshot() as snap:
        with store.write() as tx:
            tx.put_inode(reg(3, 1))
        assert [i.ino for i in snap.iter_inodes()] == [2]
        with pytest.raises(PermissionError):
            snap.put_inode(reg(9))
    with store.snapshot() as snap:
        assert [i.ino for i in snap.iter_inodes()] == [2, 3]
    store.sync()  # callable on every engine


# -- counters ---------------------------------------------------------------------------------


def test_counters(store: MetaStore) -> None:
    with store.write() as tx:
        assert tx.counter("nothing") == 0
        assert [tx.next_ino() for _ in range(3)] == [1, 2, 3]
        assert [tx.next_version() for _ in range(2)] == [1, 2]
        assert tx.add_counter("x", 5) == 5
        assert tx.add_counter("x", -2) == 3
        assert tx.add_counter("x", -10) == 0  # clamped at zero
        assert tx.add_counter("big", MAX_U64) == MAX_U64
    tx = store.write()
    tx.next_ino()
    tx.add_counter("x", 7)
    tx.abort()
    with store.read() as tx:
        assert tx.counter("next_ino") == 3
        assert tx.counter("next_version") == 2
        assert tx.counter("x") == 0
        assert tx.counter("big") == MAX_U64


# -- inodes -----------------------------------------------------------------------------------


def test_inode_put_get_delete_counts(store: MetaStore) -> None:
    with store.write() as tx:
        tx.put_inode(dir_inode(1))
        tx.put_inode(reg(2, 100))
        tx.put_inode(Inode(ino=3, mode=S_IFLNK | 0o777, uid=0, gid=0, size=7, target=b"x/y/zzz"))
        assert (tx.counter("inodes"), tx.counter("bytes")) == (3, 100)  # only files count bytes
        tx.put_inode(reg(2, 40))
        assert tx.counter("bytes") == 40
        assert tx.get_inode(2) == reg(2, 40)
        assert tx.get_inode(99) is None
        tx.delete_inode(2)
        tx.delete_inode(2)  # deleting twice changes nothing
        tx.delete_inode(99)
        assert (tx.counter("inodes"), tx.counter("bytes")) == (2, 0)
        assert tx.get_inode(2) is None
        assert [i.ino for i in tx.iter_inodes()] == [1, 3]


def test_iter_inodes_in_number_order(store: MetaStore) -> None:
    inos = [MAX_U64, 256, 1, 255, 2**32, 2]
    with store.write() as tx:
        for ino in inos:
            tx.put_inode(reg(ino))
    with store.read() as tx:
        assert [i.ino for i in tx.iter_inodes()] == sorted(inos)


inode_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.integers(1, 8),
            st.sampled_from([S_IFREG, S_IFDIR, S_IFLNK]),
            st.integers(0, 2**40),
        ),
        st.tuples(st.just("resize"), st.integers(1, 8), st.just(0), st.integers(0, 2**40)),
        st.tuples(st.just("delete"), st.integers(1, 8), st.just(0), st.just(0)),
        st.tuples(st.just("commit"), st.just(0), st.just(0), st.just(0)),
        st.tuples(st.just("abort"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=50,
)


@PROPS
@given(script=inode_ops)
def test_inode_counters_match_a_model(
    engines: EngineFactory, script: list[tuple[str, int, int, int]]
) -> None:
    """Counters stay exact through puts, resizes, type changes, deletes, commits and aborts."""
    committed: dict[int, Inode] = {}
    with engines.fresh_store() as store:
        tx: MetaTxn | None = None
        model: dict[int, Inode] = {}
        for op, ino, kind, size in script:
            if tx is None:
                tx, model = store.write(), dict(committed)
            if op == "put":
                inode = Inode(ino=ino, mode=kind | 0o600, uid=1, gid=1, size=size)
                tx.put_inode(inode)
                model[ino] = inode
            elif op == "resize":
                old = tx.get_inode(ino)
                if old is None:
                    continue
                inode = dataclasses.replace(old, size=size)
                tx.put_inode(inode)
                model[ino] = inode
            elif op == "delete":
                tx.delete_inode(ino)
                model.pop(ino, None)
            elif op == "commit":
                tx.commit()
                tx, committed = None, model
                continue
            else:
                tx.abort()
                tx = None
                continue
            assert tx.counter("inodes") == len(model)
            assert tx.counter("bytes") == sum(i.size for i in model.values() if i.is_reg)
            assert list(tx.iter_inodes()) == [model[i] for i in sorted(model)]
        if tx is not None:
            tx.abort()
        with store.read() as rtx:
            assert rtx.counter("inodes") == len(committed)
            assert rtx.counter("bytes") == sum(i.size for i in committed.values() if i.is_reg)
            assert list(rtx.iter_inodes()) == [committed[i] for i in sorted(committed)]


# -- records ----------------------------------------------------------------------------------

u64 = st.integers(0, MAX_U64)
u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=24)  # any code point but surrogates: non-ASCII included
kinds = st.sampled_from([S_IFREG, S_IFDIR, S_IFLNK, stat.S_IFIFO, stat.S_IFCHR, stat.S_IFSOCK])

inodes = st.builds(
    Inode,
    ino=u64,
    mode=st.builds(lambda k, p: k | p, kinds, st.integers(0, 0o7777)),
    uid=u32,
    gid=u32,
    size=u64,
    nlink=u32,
    atime_ns=i64,
    mtime_ns=i64,
    ctime_ns=i64,
    btime_ns=i64,
    version=u64,
    etag=text,
    state=st.integers(0, 3),
    blocks=st.dictionaries(text, st.binary(max_size=32), max_size=3),
    rdev=u64,
    parent=u64,
    target=st.binary(max_size=64),
    objmeta=st.dictionaries(text, text, max_size=4),
)
dirents = st.builds(Dirent, ino=u64, kind=kinds)
buckets = st.builds(
    Bucket,
    name=text,
    ino=u64,
    owner_uid=u32,
    created_ns=i64,
    region=text,
    policy=text,
    acl=text,
)
access_keys = st.builds(
    AccessKey,
    access_key=text,
    secret=text,
    uid=u32,
    gid=u32,
    groups=st.lists(u32, max_size=5),
    user=text,
    enabled=st.booleans(),
    admin=st.booleans(),
    created_ns=i64,
)
uploads = st.builds(
    MultipartUpload,
    upload_id=text,
    bucket=text,
    key=text,
    uid=u32,
    gid=u32,
    initiated_ns=i64,
    objmeta=st.dictionaries(text, text, max_size=3),
)
upload_parts = st.builds(
    UploadPart,
    number=st.integers(1, 10_000),
    etag=text,
    size=u64,
    mtime_ns=i64,
    checksums=st.dictionaries(text, text, max_size=3),
)
records: st.SearchStrategy[Record] = st.one_of(
    inodes, dirents, buckets, access_keys, uploads, upload_parts
)
extras = st.lists(
    st.one_of(
        st.integers(-(2**63), MAX_U64),
        text,
        st.binary(max_size=8),
        st.booleans(),
        st.none(),
        st.lists(st.integers(0, 9), max_size=3),
        st.dictionaries(text, st.integers(0, 9), max_size=2),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(record=records)
def test_record_round_trip(record: Record) -> None:
    raw = record.encode()
    assert isinstance(raw, bytes)
    back = type(record).decode(raw)
    assert back == record
    assert type(back) is type(record)


def n_required(cls: type[Record]) -> int:
    return len(
        [
            f
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    )


@settings(max_examples=200, deadline=None)
@given(record=records, extra=extras)
def test_record_ignores_appended_fields(record: Record, extra: list[Any]) -> None:
    """A record written by a newer tierd (more fields at the end) decodes in this one."""
    values = msgpack.unpackb(record.encode(), raw=False, strict_map_key=False)
    newer = msgpack.packb(values + extra, use_bin_type=True)
    assert type(record).decode(newer) == record


@settings(max_examples=200, deadline=None)
@given(record=records, data=st.data())
def test_record_defaults_missing_trailing_fields(record: Record, data: st.DataObject) -> None:
    """A record written by an older tierd (fewer fields) decodes with the newer defaults."""
    cls = type(record)
    flds = dataclasses.fields(cls)  # type: ignore[arg-type]
    keep = data.draw(st.integers(n_required(cls), len(flds)), label="keep")
    values = msgpack.unpackb(record.encode(), raw=False, strict_map_key=False)
    older = msgpack.packb(values[:keep], use_bin_type=True)
    back = cls.decode(older)
    for i, f in enumerate(flds):
        got = getattr(back, f.name)
        if i < keep:
            assert got == getattr(record, f.name)
        elif f.default is not dataclasses.MISSING:
            assert got == f.default
        else:
            factory = f.default_factory
            assert callable(factory)
            assert got == factory()


def test_defaulted_containers_are_not_shared() -> None:
    old = msgpack.packb([7, S_IFREG | 0o644, 0, 0])
    a, b = Inode.decode(old), Inode.decode(old)
    a.blocks["hot"] = b"\x01"
    a.objmeta["k"] = "v"
    assert b.blocks == {} and b.objmeta == {}


@pytest.mark.parametrize(
    ("cls", "n"),
    [
        (Inode, 4),
        (Dirent, 2),
        (Bucket, 4),
        (AccessKey, 4),
        (MultipartUpload, 6),
        (UploadPart, 4),
    ],
)
def test_required_field_counts(cls: type[Record], n: int) -> None:
    """Pins which fields are required: a new field must come last and carry a default."""
    assert n_required(cls) == n


@PROPS
@given(
    inode=inodes,
    xattrs=st.dictionaries(st.binary(min_size=1, max_size=40), st.binary(max_size=200), max_size=5),
    bucket=buckets.filter(lambda b: 0 < len(b.name.encode()) < 400),
    key=access_keys.filter(lambda k: 0 < len(k.access_key.encode()) < 400),
    upload=uploads.filter(lambda u: 0 < len(u.upload_id.encode()) < 400),
)
def test_records_round_trip_through_the_store(
    engines: EngineFactory,
    inode: Inode,
    xattrs: dict[bytes, bytes],
    bucket: Bucket,
    key: AccessKey,
    upload: MultipartUpload,
) -> None:
    with engines.fresh_store() as store:
        with store.write() as tx:
            tx.put_inode(inode)
            for name, value in xattrs.items():
                tx.set_xattr(inode.ino, name, value)
            tx.put_bucket(bucket)
            tx.put_access_key(key)
            tx.put_upload(upload)
        with store.read() as tx:
            assert tx.get_inode(inode.ino) == inode
            assert dict(tx.list_xattrs(inode.ino)) == xattrs
            for name, value in xattrs.items():
                assert tx.get_xattr(inode.ino, name) == value
            assert tx.get_bucket(bucket.name) == bucket
            assert tx.get_access_key(key.access_key) == key
            assert tx.get_upload(upload.upload_id) == upload


# -- directory entries ------------------------------------------------------------------------

PARENT = 7


def s3_order(entries: dict[bytes, bool]) -> list[bytes]:
    """Names in the order an S3 listing returns them: by the UTF-8 bytes of an object key under
    each entry (a directory ``d`` is seen through its objects ``d/...``)."""
    return sorted(entries, key=lambda n: n + b"/x" if entries[n] else n)


def add_entries(tx: MetaTxn, parent: int, entries: dict[bytes, bool]) -> dict[bytes, int]:
    inos = {}
    for i, (name, is_dir) in enumerate(entries.items()):
        ino = 1000 + i
        tx.add_dirent(parent, name, Dirent(ino, S_IFDIR if is_dir else S_IFREG))
        inos[name] = ino
    return inos


def listing(tx: MetaTxn, parent: int, **kw: Any) -> list[bytes]:
    return [name for name, _, _ in tx.list_dirents(parent, **kw)]


def test_dirent_s3_order(store: MetaStore) -> None:
    # A file and a directory with one name never coexist in the namespace; the key layout keeps
    # them apart anyway, which lets this one listing show every ordering edge at once.
    entries = {b"a0": False, b"b": True, b"a.txt": False, b"a-b": False}
    with store.write() as tx:
        add_entries(tx, PARENT, entries)
        tx.add_dirent(PARENT, b"a", Dirent(50, S_IFREG))
        tx.add_dirent(PARENT, b"a", Dirent(51, S_IFDIR))
    with store.read() as tx:
        got = [(name, skey, d.kind) for name, skey, d in tx.list_dirents(PARENT)]
    assert got == [
        (b"a", b"a", S_IFREG),
        (b"a-b", b"a-b", S_IFREG),
        (b"a.txt", b"a.txt", S_IFREG),
        (b"a", b"a/", S_IFDIR),  # after "a.txt" ('/' is 0x2f, '.' is 0x2e), before "a0"
        (b"a0", b"a0", S_IFREG),
        (b"b", b"b/", S_IFDIR),
    ]


def test_dirent_s3_order_unicode(store: MetaStore) -> None:
    names = ["z", "é", "e", "日本", "Ä", "a b", "a~", "ab", "😀", "ﬀ", "A", "_", "~"]
    entries = {n.encode(): i % 3 == 0 for i, n in enumerate(names)}
    with store.write() as tx:
        add_entries(tx, PARENT, entries)
    with store.read() as tx:
        assert listing(tx, PARENT) == s3_order(entries)
    # UTF-8 byte order (= code point order), not UTF-16 code-unit order or a locale collation
    assert s3_order({"ﬀ".encode(): False, "😀".encode(): False}) == ["ﬀ".encode(), "😀".encode()]


entry_names = (
    st.one_of(
        st.text(alphabet="a-.0b~ é/", min_size=1, max_size=4),
        st.text(min_size=1, max_size=12),
    )
    .map(lambda s: s.replace("/", "").replace("\x00", "").encode())
    .filter(lambda b: 0 < len(b) <= 255)
)


@PROPS
@given(
    entries=st.dictionaries(entry_names, st.booleans(), max_size=25),
    neighbours=st.dictionaries(entry_names, st.booleans(), max_size=5),
    data=st.data(),
)
def test_dirents_list_in_s3_order_with_markers(
    engines: EngineFactory,
    entries: dict[bytes, bool],
    neighbours: dict[bytes, bool],
    data: st.DataObject,
) -> None:
    order = s3_order(entries)
    with engines.fresh_store() as store:
        with store.write() as tx:
            inos = add_entries(tx, PARENT, entries)
            add_entries(tx, PARENT - 1, neighbours)  # adjacent parents must not leak in
            add_entries(tx, PARENT + 1, neighbours)
        with store.read() as tx:
            got = list(tx.list_dirents(PARENT))
            assert [n for n, _, _ in got] == order
            for name, skey, d in got:
                assert skey == (name + b"/" if entries[name] else name)
                assert d == Dirent(inos[name], S_IFDIR if entries[name] else S_IFREG)
            # resuming strictly after any sort key (present or not) gives the rest
            marker = data.draw(
                st.sampled_from([s for _, s, _ in got]) | entry_names if got else entry_names,
                label="start_after",
            )
            rest = [n for n, s, _ in got if s > marker]
            assert listing(tx, PARENT, start_after=marker) == rest
            assert listing(tx, PARENT, start=marker) == [n for n, s, _ in got if s >= marker]
            # an end bound is exclusive
            stop = data.draw(entry_names, label="end")
            assert listing(tx, PARENT, end=stop) == [n for n, s, _ in got if s < stop]


def test_list_dirents_paginates_and_stops_early(store: MetaStore) -> None:
    entries = {f"f{i:03d}".encode(): i % 4 == 0 for i in range(100)}
    with store.write() as tx:
        add_entries(tx, PARENT, entries)
    with store.read() as tx:
        full = list(tx.list_dirents(PARENT))
        pages, marker = [], b""
        while True:
            page = list(islice(tx.list_dirents(PARENT, start_after=marker), 7))
            if not page:
                break
            pages.extend(page)
            marker = page[-1][1]  # resume after the last sort key
        assert pages == full
        assert [n for n, _, _ in full] == s3_order(entries)
        # early stop, and the transaction is still usable for more lookups and listings
        it = tx.list_dirents(PARENT)
        assert next(it)[0] == b"f000"
        assert tx.lookup(PARENT, b"f050") is not None
        assert listing(tx, PARENT, start_after=b"f098") == [b"f099"]
        # start_after a directory's sort key vs its bare name
        assert listing(tx, PARENT, start_after=b"f004/")[:1] == [b"f005"]
        assert listing(tx, PARENT, start_after=b"f004")[:1] == [b"f004"]
        # start is inclusive; with start_after, the later bound wins
        assert listing(tx, PARENT, start=b"f004/")[:2] == [b"f004", b"f005"]
        assert listing(tx, PARENT, start=b"f004")[:1] == [b"f004"]
        assert listing(tx, PARENT, start=b"f0045")[:1] == [b"f005"]
        assert listing(tx, PARENT, start=b"f010", start_after=b"f021")[:1] == [b"f022"]
        assert listing(tx, PARENT, start=b"f021", start_after=b"f010")[:1] == [b"f021"]
        assert listing(tx, PARENT, start=b"f020", end=b"f022") == [b"f020", b"f021"]


@pytest.mark.parametrize("parent", [1, 254, 255, 256, 2**32, MAX_U64 - 1, MAX_U64])
def test_listing_stays_inside_its_parent(store: MetaStore, parent: int) -> None:
    with store.write() as tx:
        for p in {parent - 1, parent, min(parent + 1, MAX_U64)}:
            add_entries(tx, p, {b"x" + str(p).encode(): False, b"\xff\xff": True})
        add_entries(tx, parent, {b"mine": False})
    with store.read() as tx:
        assert sorted(listing(tx, parent)) == sorted(
            [b"x" + str(parent).encode(), b"\xff\xff", b"mine"]
        )
        assert tx.has_children(parent)


def test_lookup_remove_has_children(store: MetaStore) -> None:
    with store.write() as tx:
        assert not tx.has_children(PARENT)
        tx.add_dirent(PARENT, b"file", Dirent(10, S_IFREG))
        tx.add_dirent(PARENT, b"dir", Dirent(11, S_IFDIR))
        tx.add_dirent(PARENT, b"link", Dirent(12, S_IFLNK))
        tx.add_dirent(PARENT + 1, b"other", Dirent(13, S_IFREG))
        assert tx.has_children(PARENT)
        assert not tx.has_children(PARENT - 1)
    with store.read() as tx:
        assert tx.lookup(PARENT, b"file") == Dirent(10, S_IFREG)
        assert tx.lookup(PARENT, b"dir") == Dirent(11, S_IFDIR)
        assert tx.lookup(PARENT, b"link") == Dirent(12, S_IFLNK)
        # (names never contain "/" or NUL: the namespace validates them before they get here)
        for missing in (b"fil", b"files", b"di", b"other"):
            assert tx.lookup(PARENT, missing) is None, missing
        assert tx.lookup(PARENT + 1, b"file") is None
    with store.write() as tx:
        tx.add_dirent(PARENT, b"file", Dirent(20, S_IFREG))  # replace in place
        assert tx.lookup(PARENT, b"file") == Dirent(20, S_IFREG)
        assert tx.remove_dirent(PARENT, b"dir") is True
        assert tx.remove_dirent(PARENT, b"dir") is False
        assert tx.remove_dirent(PARENT, b"file") is True
        assert tx.remove_dirent(PARENT, b"nope") is False
        assert tx.lookup(PARENT, b"dir") is None
        assert listing(tx, PARENT) == [b"link"]
        assert tx.remove_dirent(PARENT, b"link")
        assert not tx.has_children(PARENT)
        assert tx.has_children(PARENT + 1)


# -- xattrs -----------------------------------------------------------------------------------


def test_xattrs(store: MetaStore) -> None:
    with store.write() as tx:
        for ino in (1, 2, 256):
            tx.put_inode(reg(ino))
        tx.set_xattr(2, b"user.b", b"\x00\xff binary")
        tx.set_xattr(2, b"user.a", b"")
        tx.set_xattr(2, b"security.selinux", b"ctx")
        tx.set_xattr(2, "user.ünï".encode(), "välue".encode())
        tx.set_xattr(1, b"user.a", b"one")
        tx.set_xattr(256, b"user.a", b"other")
        tx.set_xattr(2, b"user.b", b"replaced")
    with store.write() as tx:
        assert list(tx.list_xattrs(2)) == [
            (b"security.selinux", b"ctx"),
            (b"user.a", b""),
            (b"user.b", b"replaced"),
            ("user.ünï".encode(), "välue".encode()),
        ]
        assert tx.get_xattr(2, b"user.a") == b""
        assert tx.get_xattr(2, b"user.missing") is None
        assert tx.get_xattr(3, b"user.a") is None
        assert tx.remove_xattr(2, b"user.a") is True
        assert tx.remove_xattr(2, b"user.a") is False
        assert [n for n, _ in tx.list_xattrs(2)] == [
            b"security.selinux",
            b"user.b",
            "user.ünï".encode(),
        ]
        tx.delete_inode(2)  # takes its xattrs along, and only its own
        assert list(tx.list_xattrs(2)) == []
        assert tx.get_xattr(2, b"user.b") is None
        assert list(tx.list_xattrs(1)) == [(b"user.a", b"one")]
        assert list(tx.list_xattrs(256)) == [(b"user.a", b"other")]
    with store.read() as tx:
        assert not any(k.startswith(b"X" + (2).to_bytes(8, "big")) for k, _ in tx.kv.scan(b""))


# -- buckets, access keys, uploads, orphans ---------------------------------------------------


def _bucket(name: str, n: int) -> Bucket:
    return Bucket(name=name, ino=n, owner_uid=1000, created_ns=n)


def _key(name: str, n: int) -> AccessKey:
    return AccessKey(access_key=name, secret=f"s{n}", uid=n, gid=n, groups=[n, n + 1])


def _upload(name: str, n: int) -> MultipartUpload:
    return MultipartUpload(
        upload_id=name,
        bucket="b",
        key=f"k{n}",
        uid=1,
        gid=1,
        initiated_ns=n,
        objmeta={"content-type": f"t{n}"},
    )


CRUD = {
    "bucket": (_bucket, "put_bucket", "get_bucket", "delete_bucket", "list_buckets"),
    "access_key": (
        _key,
        "put_access_key",
        "get_access_key",
        "delete_access_key",
        "list_access_keys",
    ),
    "upload": (_upload, "put_upload", "get_upload", "delete_upload", "list_uploads"),
}


@pytest.mark.parametrize("kind", sorted(CRUD))
def test_crud(store: MetaStore, kind: str) -> None:
    make, put, get, delete, list_ = CRUD[kind]
    ops: dict[str, Callable[..., Any]] = {}

    def bind(tx: MetaTxn) -> None:
        ops.update(
            put=getattr(tx, put),
            get=getattr(tx, get),
            delete=getattr(tx, delete),
            list=getattr(tx, list_),
        )

    names = ["zeta", "alpha", "äpfel", "alpha-2", "a"]
    with store.write() as tx:
        bind(tx)
        assert ops["get"]("alpha") is None
        assert list(ops["list"]()) == []
        for n, name in enumerate(names):
            ops["put"](make(name, n))
        ops["put"](make("alpha", 99))  # update
    with store.write() as tx:
        bind(tx)
        assert ops["get"]("alpha") == make("alpha", 99)
        assert ops["get"]("alph") is None
        listed: Iterator[Any] = ops["list"]()
        assert list(listed) == [
            make(name, 99 if name == "alpha" else names.index(name))
            for name in sorted(names, key=str.encode)
        ]
        assert ops["delete"]("zeta") is True
        assert ops["delete"]("zeta") is False
        assert ops["get"]("zeta") is None
        assert len(list(ops["list"]())) == len(names) - 1


def test_record_kinds_do_not_mix(store: MetaStore) -> None:
    with store.write() as tx:
        tx.put_bucket(_bucket("same", 1))
        tx.put_access_key(_key("same", 2))
        tx.put_upload(_upload("same", 3))
        tx.put_inode(reg(1))
        tx.add_orphan(1)
    with store.read() as tx:
        assert [b.name for b in tx.list_buckets()] == ["same"]
        assert [k.access_key for k in tx.list_access_keys()] == ["same"]
        assert [u.upload_id for u in tx.list_uploads()] == ["same"]
        assert [i.ino for i in tx.iter_inodes()] == [1]
        assert tx.list_orphans() == [1]
        assert tx.counter("inodes") == 1


def test_orphans(store: MetaStore) -> None:
    inos = [MAX_U64, 256, 2, 1, 255]
    with store.write() as tx:
        for ino in inos:
            tx.put_inode(reg(ino, 10, state=STATE_CLEAN))
            tx.add_orphan(ino)
        tx.add_orphan(2)  # idempotent
        assert tx.list_orphans() == sorted(inos)
        tx.remove_orphan(256)
        tx.remove_orphan(256)
        tx.remove_orphan(12345)
        tx.delete_inode(255)  # an orphan goes with its inode
    with store.read() as tx:
        assert tx.list_orphans() == [1, 2, MAX_U64]
        assert tx.get_inode(256) is not None  # removing the orphan mark keeps the inode


@pytest.mark.parametrize("node", ["", "n1"])
def test_an_intention_and_an_open_mark_go_with_their_inode(engine: KVStore,
                                                           node: str) -> None:
    """On one node and on a cluster node alike (whose ``V`` and ``O`` keys carry its name),
    deleting an inode deletes this node's intention and open mark of it."""
    store = MetaStore(engine, node=node)
    with store.write() as tx:
        for ino in (7, 8):
            tx.put_inode(reg(ino, 10, state=STATE_CLEAN))
            tx.add_intent(ino, kernel=True)
            tx.add_orphan(ino)
    with store.write() as tx:
        tx.delete_inode(7)
    with store.read() as tx:
        assert tx.list_intents() == [8] and tx.list_intents(kernel=True) == [8]
        assert tx.list_orphans() == [8]


def test_open_lmdb_closes_the_environment_on_schema_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierd.meta.lmdb_engine import LmdbStore

    engine = LmdbStore(tmp_path)
    with engine.begin(write=True) as tx:
        tx.put(b"\x00schema", msgpack.packb(SCHEMA_VERSION + 1))
    engine.close()
    closed: list[LmdbStore] = []
    real_close = LmdbStore.close

    def close(self: LmdbStore) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(LmdbStore, "close", close)
    with pytest.raises(SchemaError):
        MetaStore.open_lmdb(tmp_path)
    assert len(closed) == 1


def test_upload_parts(store: MetaStore) -> None:
    def part(n: int) -> UploadPart:
        return UploadPart(number=n, etag=f"{n:032x}", size=n * 10, mtime_ns=n)

    numbers = [10_000, 3, 1, 256, 2, 255]
    with store.write() as tx:
        tx.put_upload(_upload("up", 1))
        tx.put_upload(_upload("up2", 2))  # an upload id that extends another one
        for n in numbers:
            tx.put_part("up", part(n))
        tx.put_part("up2", part(1))
        tx.put_part("u", part(7))  # and one that is a prefix of it
        tx.put_part("up", part(3))  # re-uploading a part replaces it
    with store.write() as tx:
        assert [p.number for p in tx.list_parts("up")] == sorted(numbers)
        assert [p.number for p in tx.list_parts("up", after=3)] == [255, 256, 10_000]
        assert [p.number for p in tx.list_parts("up", after=10_000)] == []
        assert tx.get_part("up", 256) == part(256)
        assert tx.get_part("up", 4) is None
        assert tx.get_part("nope", 1) is None
        assert list(tx.list_parts("up2")) == [part(1)]
        assert list(tx.list_parts("u")) == [part(7)]
        assert tx.delete_parts("up") == len(numbers)
        assert list(tx.list_parts("up")) == []
        assert tx.delete_parts("up") == 0
        assert list(tx.list_parts("up2")) == [part(1)]
        assert list(tx.list_parts("u")) == [part(7)]
        assert tx.get_upload("up") is not None  # parts and the upload record are separate
