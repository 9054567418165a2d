"""Block bitmaps as stored in ``Inode.blocks[tier]``: bit *i* (LSB first) = block *i*.

A missing ``"hot"`` entry means the whole file is present (written locally, or from before
placement), so a file that never left the hot tier costs no bitmap at all.
"""

from __future__ import annotations

from collections.abc import Iterable

from tierd.tiers import BLOCK_SIZE


def nblocks(size: int) -> int:
    return (size + BLOCK_SIZE - 1) // BLOCK_SIZE


def has(bm: bytes, i: int) -> bool:
    return i // 8 < len(bm) and bool(bm[i // 8] >> (i % 8) & 1)


def with_bits(bm: bytes, idxs: Iterable[int], value: bool) -> bytes:
    out = bytearray(bm)
    for i in idxs:
        if i // 8 >= len(out):
            out.extend(bytes(i // 8 + 1 - len(out)))
        if value:
            out[i // 8] |= 1 << (i % 8)
        else:
            out[i // 8] &= ~(1 << (i % 8)) & 0xFF
    return bytes(out)


def full(size: int) -> bytes:
    return with_bits(b"", range(nblocks(size)), True)


def present(bm: bytes | None, size: int) -> list[int]:
    """Indexes of present blocks of a ``size``-byte file (``None``: all of them)."""
    if bm is None:
        return list(range(nblocks(size)))
    return [i for i in range(nblocks(size)) if has(bm, i)]


def block_bytes(size: int, i: int) -> int:
    """Bytes of block ``i`` inside a ``size``-byte file (the last block may be short)."""
    return max(0, min(BLOCK_SIZE, size - i * BLOCK_SIZE))


def runs(blocks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct block indexes as ``(first, count)`` runs of consecutive blocks."""
    out: list[tuple[int, int]] = []
    for b in sorted(set(blocks)):
        if out and out[-1][0] + out[-1][1] == b:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((b, 1))
    return out


def count(bm: bytes) -> int:
    """Number of blocks present."""
    return int.from_bytes(bm, "little").bit_count()
