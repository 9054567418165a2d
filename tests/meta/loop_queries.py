"""Counting the PostgreSQL queries made on the event loop's thread (test_pg_warm_*.py)."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nsplacement import close_namespace

from tierd.meta.pg_engine import PgTxn
from tierd.namespace import Namespace


@dataclass
class LoopQueries:
    """A stand-in for ``PgTxn._query`` (install :meth:`counted` with monkeypatch, in the
    thread that runs the loop) that counts the calls made on that thread while a function
    named in ``where``, in a file under ``under``, is on the stack -- the code under test,
    not the rest of the daemon's background work."""

    where: Iterable[str]
    under: str
    seen: dict[str, int] = field(default_factory=dict)
    #: the call sites of each, shown when a test fails
    wheres: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._query = PgTxn._query
        self._me = threading.get_ident()
        self._names = set(self.where)

    @property
    def counted(self) -> Callable[..., list[Any]]:
        def counted(txn: PgTxn, *a: Any, **kw: Any) -> list[Any]:
            if threading.get_ident() == self._me:
                stack = traceback.extract_stack()
                ops = {f.name for f in stack if self.under in f.filename} & self._names
                for op in ops:
                    where = [f"{f.name}:{f.lineno}" for f in stack if "/tierd/" in f.filename]
                    self.seen[op] = self.seen.get(op, 0) + 1
                    self.wheres.setdefault(op, []).append(" > ".join(where[-6:]))
            return self._query(txn, *a, **kw)
        return counted


async def close_nodes(*nodes: Namespace) -> None:
    """Close the namespaces of the test's nodes, then their stores."""
    for ns in nodes:
        await close_namespace(ns)
    for ns in nodes:
        ns.meta.close()
