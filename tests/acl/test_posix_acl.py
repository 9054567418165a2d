"""tierd.acl.posix_acl against the xattr format, an independent model and the kernel itself.

The kernel tests set the same ACL on a file of the local file system (ext4/tmpfs keep POSIX
ACLs) and ask the kernel: what mode it derived, what each identity may do (a forked child
with that uid and those groups calls access(2)), what chmod and create-with-inheritance
produce.  They need root (chown, setuid) and are skipped otherwise.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from public_dir import public_tempdir

from tierd.acl import posix_acl as pa
from tierd.errors import FsError

IDS = [5000, 5001, 5002, 5003]
OWNER, GROUP = 5000, 5000
IS_ROOT = os.geteuid() == 0


def blob(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


U = pa.UNDEFINED_ID


# -- strategies ------------------------------------------------------------------------------
@st.composite
def acls(draw: st.DrawFn, named: bool = True) -> pa.Acl:
    """Valid ACLs in canonical order: base entries, sorted unique named ones, a mask when
    needed (sometimes also without named entries)."""
    perm = st.integers(0, 7)
    users = sorted(draw(st.sets(st.sampled_from(IDS), max_size=3))) if named else []
    groups = sorted(draw(st.sets(st.sampled_from(IDS), max_size=3))) if named else []
    with_mask = bool(users or groups) or draw(st.booleans())
    out = [pa.AclEntry(pa.USER_OBJ, draw(perm))]
    out += [pa.AclEntry(pa.USER, draw(perm), u) for u in users]
    out.append(pa.AclEntry(pa.GROUP_OBJ, draw(perm)))
    out += [pa.AclEntry(pa.GROUP, draw(perm), g) for g in groups]
    if with_mask:
        out.append(pa.AclEntry(pa.MASK, draw(perm)))
    out.append(pa.AclEntry(pa.OTHER, draw(perm)))
    return tuple(out)


identities = st.tuples(st.sampled_from(IDS), st.sampled_from(IDS),
                       st.frozensets(st.sampled_from(IDS), max_size=3))


# -- format ------------------------------------------------------------------------------------
@given(acls())
def test_round_trip(acl: pa.Acl) -> None:
    raw = pa.serialize(acl)
    assert len(raw) == 4 + 8 * len(acl)
    assert pa.parse(raw) == acl
    assert pa.serialize(pa.parse(raw)) == raw


def test_unnamed_ids_are_written_as_minus_one() -> None:
    raw = blob((1, 6, 7), (4, 4, 9), (0x20, 4, 123))
    acl = pa.parse(raw)
    assert all(e.id == U for e in acl)
    assert pa.serialize(acl) == blob((1, 6, U), (4, 4, U), (0x20, 4, U))


def test_header_only_is_the_empty_acl() -> None:
    assert pa.parse(blob()) == ()


BAD = {
    "short": b"\x02\x00",
    "ragged": blob((1, 6, U)) + b"\x00\x00",
    "bad tag": blob((1, 6, U), (0x40, 4, U), (4, 4, U), (0x20, 4, U)),
    "bad perm": blob((1, 8, U), (4, 4, U), (0x20, 4, U)),
    "no user_obj": blob((4, 4, U), (0x20, 4, U)),
    "no other": blob((1, 6, U), (4, 4, U)),
    "two other": blob((1, 6, U), (4, 4, U), (0x20, 4, U), (0x20, 4, U)),
    "named without mask": blob((1, 6, U), (2, 4, 7), (4, 4, U), (0x20, 4, U)),
    "unsorted users": blob((1, 6, U), (2, 4, 9), (2, 4, 7), (4, 4, U), (0x10, 7, U),
                           (0x20, 4, U)),
    "duplicate group": blob((1, 6, U), (4, 4, U), (8, 4, 7), (8, 5, 7), (0x10, 7, U),
                            (0x20, 4, U)),
    "tags out of order": blob((1, 6, U), (4, 4, U), (2, 4, 7), (0x10, 7, U), (0x20, 4, U)),
    "mask after other": blob((1, 6, U), (4, 4, U), (0x20, 4, U), (0x10, 7, U)),
    "named id -1": blob((1, 6, U), (2, 4, U), (4, 4, U), (0x10, 7, U), (0x20, 4, U)),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_invalid_blobs_are_einval(name: str) -> None:
    with pytest.raises(FsError) as ei:
        pa.parse(BAD[name])
    assert ei.value.errno == errno.EINVAL, name


def test_unknown_version_is_eopnotsupp() -> None:
    with pytest.raises(FsError) as ei:
        pa.parse(struct.pack("<I", 1) + blob((1, 6, U), (4, 4, U), (0x20, 4, U))[4:])
    assert ei.value.errno == errno.EOPNOTSUPP


@given(st.binary(max_size=80))
@settings(max_examples=500)
def test_random_blobs_parse_or_fail_cleanly(raw: bytes) -> None:
    try:
        acl = pa.parse(raw)
    except FsError as e:
        assert e.errno in (errno.EINVAL, errno.EOPNOTSUPP)
        return
    assert pa.serialize(acl) == raw or any(e.tag not in (pa.USER, pa.GROUP) for e in acl)


@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 0x10, 0x20, 3]), st.integers(0, 9),
                          st.sampled_from([5000, 5001, U])), max_size=9))
@settings(max_examples=500)
def test_random_entry_lists_parse_or_einval(entries: list[tuple[int, int, int]]) -> None:
    try:
        acl = pa.parse(blob(*entries))
    except FsError as e:
        assert e.errno == errno.EINVAL
        return
    if acl:
        pa.validate(acl)  # whatever parses is valid (or the empty ACL: a removal)
    else:
        assert entries == []


# -- algorithms against a straightforward model -------------------------------------------
def model_access(uid: int, groups: set[int], mode: int, acl: pa.Acl | None, want: int) -> bool:
    """Linux's rule written out plainly (no shared code with posix_acl.permission)."""
    owner_bits, group_bits, other_bits = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
    if acl is None and want & owner_bits & group_bits & other_bits == want:
        return True  # every class has it (with an ACL the kernel looks closer)
    if uid == OWNER:
        return want & owner_bits == want
    if acl is None or group_bits == 0:
        if GROUP in groups and want & (group_bits ^ other_bits):
            return want & group_bits == want
        return want & other_bits == want
    mask = group_bits
    named = [e for e in acl if e.tag == pa.USER and e.id == uid]
    if named:
        return want & named[0].perm & mask == want
    matching = [e.perm for e in acl
                if (e.tag == pa.GROUP_OBJ and GROUP in groups)
                or (e.tag == pa.GROUP and e.id in groups)]
    if matching:
        return any(want & p & mask == want for p in matching)
    return want & other_bits == want


def acl_mode(acl: pa.Acl) -> int:
    mode, _ = pa.equiv_mode(acl, stat.S_IFREG)
    return mode


@given(acls(), identities, st.integers(1, 7))
@settings(max_examples=2000)
def test_permission_matches_model(acl: pa.Acl, who: tuple[int, int, frozenset[int]],
                                  want: int) -> None:
    uid, gid, sup = who
    groups = {gid, *sup}
    mode = acl_mode(acl)
    raw = pa.serialize(acl)
    got = pa.permission(uid, groups.__contains__, mode, OWNER, GROUP, raw, want)
    assert got == model_access(uid, groups, mode, acl, want), (pa.describe(acl), who, want)


@given(st.integers(0, 0o777), identities, st.integers(1, 7))
def test_without_acl_the_mode_decides(mode: int, who: tuple[int, int, frozenset[int]],
                                      want: int) -> None:
    uid, gid, sup = who
    groups = {gid, *sup}
    got = pa.permission(uid, groups.__contains__, mode, OWNER, GROUP, b"", want)
    assert got == model_access(uid, groups, mode, None, want)


@given(acls(), st.integers(0, 0o7777))
def test_chmod_then_equiv_gives_the_mode(acl: pa.Acl, mode: int) -> None:
    new = pa.chmod_acl(acl, mode)
    assert pa.equiv_mode(new, stat.S_IFREG)[0] & 0o777 == mode & 0o777
    # named entries and the owning group's entry (with a mask) are untouched
    has_mask = any(e.tag == pa.MASK for e in acl)
    for old, cur in zip(acl, new, strict=True):
        if old.tag in (pa.USER, pa.GROUP) or (old.tag == pa.GROUP_OBJ and has_mask):
            assert old == cur


def test_minimal_acl_is_equivalent_to_the_mode() -> None:
    acl = pa.from_mode(0o754)
    assert pa.equiv_mode(acl, stat.S_IFREG | 0o4000) == (stat.S_IFREG | 0o4754, False)
    inh = pa.inherit(pa.serialize(acl), stat.S_IFREG | 0o666, 0o077)
    assert inh.mode == stat.S_IFREG | 0o644 and inh.access == b""  # umask ignored


def test_inherit_without_default_applies_the_umask() -> None:
    inh = pa.inherit(b"", stat.S_IFDIR | 0o777, 0o027)
    assert inh == pa.Inherited(stat.S_IFDIR | 0o750)


# -- the kernel as the reference ------------------------------------------------------------
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown, setuid children)")


@pytest.fixture(scope="module")
def local_dir() -> Iterator[Path]:
    with public_tempdir("tierd-acl-kernel-") as d:
        probe = d / "probe"
        probe.touch()
        try:
            os.setxattr(probe, pa.ACCESS_XATTR, pa.serialize(pa.from_mode(0o644)))
        except OSError as e:
            pytest.skip(f"the local file system does not keep POSIX ACLs: {e}")
        yield d


def kernel_access(path: Path, uid: int, gid: int, groups: frozenset[int]) -> int:
    """Bit ``want`` set in the result when the kernel allows access(path, want) to that
    identity (a forked child drops to it; one fork per identity answers all 7 masks)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.setgroups(sorted(groups | {gid}))
            os.setgid(gid)
            os.setuid(uid)
            bits = sum(1 << m for m in range(1, 8) if os.access(path, m))
            os.write(w, bytes([bits]))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert data, "the access child failed"
    return data[0]


counter = iter(range(10**9))
Kernel = Callable[[], Path]


def fresh(local_dir: Path, make_dir: bool = False) -> Path:
    p = local_dir / f"o{next(counter)}"
    if make_dir:
        p.mkdir()
    else:
        p.touch()
    os.chown(p, OWNER, GROUP)
    return p


@needs_root
@given(acls(), st.lists(identities, min_size=1, max_size=4, unique=True))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
def test_access_and_mode_match_the_kernel(
    local_dir: Path, acl: pa.Acl, who: list[tuple[int, int, frozenset[int]]]
) -> None:
    path = fresh(local_dir)
    raw = pa.serialize(acl)
    os.setxattr(path, pa.ACCESS_XATTR, raw)
    kmode = os.stat(path).st_mode
    mode, not_equiv = pa.equiv_mode(acl, stat.S_IFREG | 0o644)
    assert kmode == mode, (pa.describe(acl), oct(kmode), oct(mode))
    try:
        stored = os.getxattr(path, pa.ACCESS_XATTR)
    except OSError as e:
        assert e.errno == errno.ENODATA
        stored = b""
    assert bool(stored) == not_equiv  # an ACL equivalent to the mode is not kept
    for uid, gid, sup in who:
        groups = sup | {gid}
        kernel = kernel_access(path, uid, gid, sup)
        ours = sum(1 << m for m in range(1, 8)
                   if pa.permission(uid, groups.__contains__, mode, OWNER, GROUP,
                                    raw if not_equiv else b"", m))
        assert ours == kernel, (pa.describe(acl), (uid, gid, sorted(sup)), bin(ours),
                                bin(kernel))


@needs_root
@given(acls(), st.integers(0, 0o777))
@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
def test_chmod_matches_the_kernel(local_dir: Path, acl: pa.Acl, mode: int) -> None:
    path = fresh(local_dir)
    os.setxattr(path, pa.ACCESS_XATTR, pa.serialize(acl))
    os.chmod(path, mode)
    _, not_equiv = pa.equiv_mode(acl, 0)
    if not not_equiv:
        with pytest.raises(OSError):
            os.getxattr(path, pa.ACCESS_XATTR)
        return
    assert os.getxattr(path, pa.ACCESS_XATTR) == pa.serialize(pa.chmod_acl(acl, mode))


@needs_root
@given(acls(), st.integers(0, 0o7777), st.integers(0, 0o777), st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
def test_inheritance_matches_the_kernel(local_dir: Path, default: pa.Acl, mode: int,
                                        umask: int, is_dir: bool) -> None:
    parent = fresh(local_dir, make_dir=True)
    raw = pa.serialize(default)
    os.setxattr(parent, pa.DEFAULT_XATTR, raw)
    child = parent / "c"
    old = os.umask(umask)
    try:
        if is_dir:
            os.mkdir(child, mode)
        else:
            os.close(os.open(child, os.O_CREAT | os.O_WRONLY, mode))
    finally:
        os.umask(old)
    kind = stat.S_IFDIR if is_dir else stat.S_IFREG
    # the kernel strips setuid/setgid from mkdir's mode, and a file's setgid bit when the
    # creator (root here) ... is privileged: keep the create mode the kernel really used
    used = mode & (0o1777 if is_dir else 0o7777)
    inh = pa.inherit(raw, kind | used, umask)
    st_ = os.stat(child)
    assert st_.st_mode == inh.mode, (pa.describe(default), oct(mode), oct(st_.st_mode),
                                     oct(inh.mode))
    try:
        access = os.getxattr(child, pa.ACCESS_XATTR)
    except OSError:
        access = b""
    assert access == inh.access
    try:
        dflt = os.getxattr(child, pa.DEFAULT_XATTR)
    except OSError:
        dflt = b""
    assert dflt == inh.default
