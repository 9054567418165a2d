"""Sorted, paginated S3 listing over a tree of directories.

Shared by the engines whose store is a tree of directories (file://, fsspec): S3 listing
order and pagination are rebuilt from per-directory listings, pruning every subtree outside
the prefix or before the start key, so a page costs O(depth) directory reads, not a walk.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from tierd.tiers.object_tier import MAX_CHAR, ListPage, ObjectInfo, list_lower_bound


class TreeEntry(NamedTuple):
    """One directory entry: ``name``, whether it is a directory, engine-specific payload."""

    name: str
    is_dir: bool
    payload: Any


ListDir = Callable[[str], Sequence[TreeEntry]]
MakeInfo = Callable[[str, Any], "ObjectInfo | None"]


def _first(pair: tuple[str, TreeEntry]) -> str:
    return pair[0]


class TreeLister:
    """Answers :meth:`ObjectTier.list` from a ``listdir(rel_dir)`` function.

    ``listdir("")`` lists the store's top (buckets), ``listdir("a/b/")`` a directory; a
    missing directory lists as empty.  ``make_info(key, payload)`` returns the object's
    info or ``None`` to leave the entry out (it vanished, or is not a valid key).  A
    directory's entries are read once per listing call and kept for its duration."""

    def __init__(self, listdir: ListDir, make_info: MakeInfo) -> None:
        self._listdir = listdir
        self._make_info = make_info
        self._cache: dict[str, tuple[list[str], list[TreeEntry]]] = {}

    def _entries(self, rel: str) -> tuple[list[str], list[TreeEntry]]:
        got = self._cache.get(rel)
        if got is None:
            ents = [e for e in self._listdir(rel) if "/" not in e.name and e.name]
            keyed = sorted(
                ((rel + e.name + ("/" if e.is_dir else ""), e) for e in ents), key=_first
            )
            got = ([k for k, _ in keyed], [e for _, e in keyed])
            self._cache[rel] = got
        return got

    def _keys_after(self, rel: str, prefix: str, lo: str) -> Iterator[tuple[str, Any]]:
        fulls, ents = self._entries(rel)
        i = bisect.bisect_right(fulls, lo)
        if i > 0 and ents[i - 1].is_dir and lo.startswith(fulls[i - 1]):
            i -= 1  # the directory holding ``lo``: part of its subtree sorts after lo
        for full, ent in zip(fulls[i:], ents[i:], strict=True):
            if not (full.startswith(prefix) or (ent.is_dir and prefix.startswith(full))):
                if full > prefix:
                    return  # sorted: everything further is past the prefix
                continue
            if ent.is_dir:
                yield from self._keys_after(full, prefix, lo)
            elif full > lo:
                yield full, ent.payload

    def list(self, prefix: str, start_after: str, delimiter: str, limit: int) -> ListPage:
        lo = list_lower_bound(prefix, start_after, delimiter)
        top = prefix[: prefix.rfind("/") + 1]
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        it = self._keys_after(top, prefix, lo)
        while True:
            nxt = next(it, None)
            if nxt is None:
                return ListPage(objects, prefixes, False)
            key, payload = nxt
            if delimiter:
                j = key.find(delimiter, len(prefix))
                if j >= 0:
                    if len(objects) + len(prefixes) >= limit:
                        return ListPage(objects, prefixes, True)
                    cp = key[: j + len(delimiter)]
                    prefixes.append(cp)
                    it = self._keys_after(top, prefix, cp + MAX_CHAR)
                    continue
            info = self._make_info(key, payload)
            if info is None:
                continue
            if len(objects) + len(prefixes) >= limit:
                return ListPage(objects, prefixes, True)
            objects.append(info)
