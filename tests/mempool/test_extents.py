"""The pool's address space (tierd/mempool/extents.py): large regions first-fit in 2 MiB
units, small ones packed into 4 KiB pages of 2 MiB slabs.

tests/checkpoint/test_pool.py checks first-fit, coalescing and fragmentation of large
extents; these check the packing, and a model run of random allocations and frees against
the invariants every sequence must keep.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierd.mempool.extents import ALIGN, PAGE, SMALL, Extents, align_up

KiB = 1 << 10


def test_align_up_picks_the_unit_by_size() -> None:
    assert align_up(0) == PAGE  # an empty region still holds a page
    assert align_up(1) == PAGE
    assert align_up(10 * KiB) == 12 * KiB
    assert align_up(SMALL - PAGE) == SMALL - PAGE  # the largest packed region
    assert align_up(SMALL - 1) == ALIGN  # its pages would reach the threshold: a unit
    assert align_up(SMALL) == ALIGN  # from half a unit on: whole 2 MiB units
    assert align_up(ALIGN + 1) == 2 * ALIGN


def test_small_regions_share_one_slab_until_it_is_full() -> None:
    e = Extents(4 * ALIGN)
    offs = [e.alloc(10 * KiB) for _ in range(ALIGN // (12 * KiB))]
    assert all(o is not None for o in offs)
    assert {o // ALIGN for o in offs if o is not None} == {0}  # all in the first slab
    assert e.free == 4 * ALIGN - len(offs) * 12 * KiB
    nxt = e.alloc(10 * KiB)  # the first slab has 8 KiB left: a second slab is carved
    assert nxt is not None and nxt // ALIGN == 1


def test_an_emptied_slab_goes_back_to_the_range() -> None:
    e = Extents(2 * ALIGN)
    a, b = e.alloc(PAGE), e.alloc(3 * PAGE)
    assert a is not None and b is not None
    assert e.alloc(ALIGN) == ALIGN and e.alloc(ALIGN) is None  # the slab holds the rest
    e.release(a, PAGE)
    assert e.alloc(ALIGN) is None  # one region left in the slab: it stays carved
    e.release(b, 3 * PAGE)
    assert e.free == ALIGN and e.largest == ALIGN
    assert e.alloc(ALIGN) == 0  # the whole slab is a large extent again


def test_fits_agrees_with_what_alloc_finds() -> None:
    e = Extents(2 * ALIGN)
    assert e.alloc(ALIGN) == 0 and e.alloc(PAGE) == ALIGN  # the last unit becomes a slab
    assert not e.fits(ALIGN)  # no large extent left...
    assert e.fits(100 * KiB)  # ...but the slab takes small regions
    assert e.alloc(100 * KiB) is not None


def test_releases_that_do_not_match_an_allocation_are_refused() -> None:
    e = Extents(4 * ALIGN)
    off = e.alloc(PAGE)
    assert off is not None
    with pytest.raises(ValueError):
        e.release(3 * ALIGN, PAGE)  # no slab there
    e.release(off, PAGE)
    with pytest.raises(ValueError):
        e.release(0, ALIGN)  # already free


def test_capacity_rounds_down_to_whole_units() -> None:
    e = Extents(3 * ALIGN + ALIGN // 2)
    assert e.capacity == e.free == e.largest == 3 * ALIGN
    assert e.fragmentation() == 0.0


SIZES = st.sampled_from([1, PAGE, 3 * PAGE + 1, 200 * KiB, SMALL - 1, SMALL, ALIGN,
                         ALIGN + 1, 3 * ALIGN])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 1 << 16)), max_size=80))
def test_random_allocations_keep_the_invariants(steps: list[tuple[bool, int, int]]) -> None:
    """Extents never overlap or leave the range, free bytes are the capacity minus what the
    live regions hold, alloc fails exactly when fits says so, and freeing everything gives
    one free extent back."""
    e = Extents(8 * ALIGN)
    live: dict[int, int] = {}  # offset -> size asked
    for alloc, size, pick in steps:
        if alloc or not live:
            fits = e.fits(size)
            off = e.alloc(size)
            assert (off is not None) == fits, (size, fits, off)
            if off is None:
                continue
            end = off + align_up(size)
            assert off >= 0 and end <= e.capacity
            for o, s in live.items():
                assert end <= o or o + align_up(s) <= off, f"{off}+{size} overlaps {o}+{s}"
            if align_up(size) >= SMALL:
                assert off % ALIGN == 0
            else:
                assert off % PAGE == 0 and off // ALIGN == (end - 1) // ALIGN  # one slab
            live[off] = size
        else:
            off = sorted(live)[pick % len(live)]
            e.release(off, live.pop(off))
        assert e.free == e.capacity - sum(align_up(s) for s in live.values())
        assert 0.0 <= e.fragmentation() < 1.0
    for off, size in list(live.items()):
        e.release(off, size)
    assert e.free == e.largest == e.capacity
    assert e.fragmentation() == 0.0


def test_a_region_just_under_half_a_unit_keeps_large_extents_aligned() -> None:
    """Regression: a region of SMALL-PAGE+1 .. SMALL-1 bytes rounded up to exactly SMALL in
    pages, was then taken as a large extent of half a unit, and every large extent after it
    (and the slabs carved from them) sat off the 2 MiB grid: a later free of a small region
    found no slab ("is in no slab")."""
    e = Extents(4 * ALIGN)
    odd = e.alloc(SMALL - 1)
    assert odd is not None
    big = e.alloc(ALIGN)
    assert big is not None and big % ALIGN == 0
    small = e.alloc(1)
    assert small is not None
    e.release(small, 1)
    e.release(odd, SMALL - 1)
    e.release(big, ALIGN)
    assert e.free == e.largest == e.capacity
