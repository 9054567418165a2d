"""Pieces of an engine that layers one key space over another (the group commit's
overlay over lmdb, a transaction's own writes over both): the sorted merge of two
layers, and the stand-in for a snapshot that has ended."""

from __future__ import annotations

from collections.abc import Iterator

from tierd.meta.kv import KVTxn


def merge_layers(
    upper: Iterator[tuple[bytes, bytes | None]],
    lower: Iterator[tuple[bytes, bytes | None]],
    reverse: bool,
) -> Iterator[tuple[bytes, bytes | None]]:
    """Two sorted streams as one; ``upper`` wins on equal keys (None values are deletions
    and are passed on, so a third layer below can be hidden too)."""
    u = next(upper, None)
    lo = next(lower, None)
    while u is not None or lo is not None:
        if lo is None or (u is not None and ((u[0] > lo[0]) if reverse else (u[0] < lo[0]))):
            assert u is not None
            yield u
            u = next(upper, None)
        elif u is None or u[0] != lo[0]:
            yield lo
            lo = next(lower, None)
        else:
            yield u
            u = next(upper, None)
            lo = next(lower, None)


class Ended(KVTxn):
    """Stands in for an ended transaction's inner snapshot."""

    write = False

    def get(self, key: bytes) -> bytes | None:
        raise RuntimeError("transaction already ended")

    def put(self, key: bytes, value: bytes) -> None:
        raise RuntimeError("transaction already ended")

    def delete(self, key: bytes) -> bool:
        raise RuntimeError("transaction already ended")

    def scan(
        self, start: bytes, end: bytes | None = None, *, reverse: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        raise RuntimeError("transaction already ended")

    def commit(self) -> None:
        return None

    def abort(self) -> None:
        return None


#: the one :class:`Ended`
ENDED = Ended()
