"""The part protocol of multi-rank steps, driven directly (what ``TierdStorageWriter`` does
under ``torchrun``): parts left in doubt on a node other than the coordinator's settle from
the cold store; a new save of the step supersedes an unfinished one; a commit after an
abort is refused with the reason."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tierd_client.checkpoint import Checkpointer
from tierd_client.pool import PoolRequestError

from .conftest import Tierd


@pytest.fixture
def nodes(public_dir: Path) -> Iterator[tuple[Tierd, Tierd]]:
    cold = public_dir / "cold"
    cold.mkdir()
    made = []
    for name in ("a", "b"):
        (public_dir / name).mkdir()
        made.append(Tierd(public_dir / name / "data", "--cold-url", f"file://{cold}"))
    yield made[0], made[1]
    for t in made:
        t.stop()


def write_part(ck: Checkpointer, step: int, part: int, save: str, data: bytes,
               coordinator: bool = False) -> None:
    spec: dict[str, Any] = {"part": part, "parts": 2, "save": save}
    m = ck.stage("run", step, len(data), coordinator=coordinator, **spec)
    m.mm[:len(data)] = data
    ck.commit("run", step, {"size": len(data)}, **spec)


def doubted(coord: Checkpointer, b: Tierd, step: int, save: str, one: bytes,
            two: bytes) -> None:
    """Part 0 on the coordinator's node, part 1 on ``b`` by a writer that then went away
    (before any commit reached ``b``: its part is in doubt there)."""
    write_part(coord, step, 0, save, one, coordinator=True)
    with Checkpointer(b.socket) as other:
        write_part(other, step, 1, save, two)


def manifest(sizes: list[int]) -> dict[str, Any]:
    return {"entries": [], "parts": [{"part": i, "size": n} for i, n in enumerate(sizes)]}


def steps(ck: Checkpointer) -> list[int]:
    return [s["step"] for s in ck.list("run")]


def test_parts_in_doubt_settle_from_the_cold_manifest(nodes: tuple[Tierd, Tierd]) -> None:
    a, b = nodes
    one, two = b"\x01" * 5000, b"\x02" * 7000
    with Checkpointer(a.socket) as coord:
        doubted(coord, b, 5, "s1", one, two)
        # b's writer went away after committing its part, before any commit reached b:
        # the step may be committed elsewhere, so b keeps the part, unpublished
        with Checkpointer(b.socket) as look:
            assert steps(look) == []
        assert coord.commit("run", 5, manifest([len(one), len(two)]), parts=2,
                            save="s1") == "committed"
        assert coord.wait_persisted("run", 5, level="local") in ("local", "persisted")
    deadline = time.monotonic() + 60
    with Checkpointer(b.socket) as look:  # each look asks cold for the step's manifest
        while steps(look) != [5] and time.monotonic() < deadline:
            time.sleep(0.3)
        assert steps(look) == [5] and look.list("run")[0]["parts_here"] == [1]
        mm, size, _ = look.open_part("run", 5, 1)
        assert size == len(two) and mm[:size] == two
        mm, size, where = look.open_part("run", 5, 0)  # a's part, through cold
        assert where in ("cold", "hot") and mm[:size] == one
        assert look.wait_persisted("run", 5, timeout=60) == "persisted"


def test_parts_in_doubt_settle_with_no_client_asking(nodes: tuple[Tierd, Tierd],
                                                     public_dir: Path) -> None:
    """Nothing asks b about the run once its writer went away (a job whose ranks there
    exited before passing the commit on): b still learns the outcome from cold, publishes
    its part, and the coordinator's node, which waits for every part to reach cold, sees
    the step persisted.  Before, b looked only when a client of b named the run."""
    a, b = nodes
    one, two = b"\x03" * 3000, b"\x04" * 4000
    with Checkpointer(a.socket) as coord:
        doubted(coord, b, 6, "s6", one, two)
        assert coord.commit("run", 6, manifest([len(one), len(two)]), parts=2,
                            save="s6") == "committed"
        assert coord.wait_persisted("run", 6, timeout=60) == "persisted"
    stored = [p for p in (public_dir / "cold").rglob("*") if p.is_file()]
    part = [p for p in stored if p.as_posix().endswith("/run/step-6/data-1")]
    assert part and part[0].read_bytes() == two
    assert not [p for p in stored if ".tierd-tmp" in p.as_posix()]


def test_a_new_save_supersedes_an_unfinished_one_and_late_commits_are_refused(
        tierd: Tierd) -> None:
    with Checkpointer(tierd.socket) as coord, Checkpointer(tierd.socket) as other:
        write_part(coord, 7, 0, "old", b"o" * 100, coordinator=True)
        write_part(other, 7, 1, "old", b"p" * 100)
        # the job failed before its commit; a retry of the same step is a new save
        write_part(coord, 7, 0, "new", b"n" * 300, coordinator=True)
        with pytest.raises(PoolRequestError) as e:
            coord.commit("run", 7, manifest([100, 100]), parts=2, save="old")
        assert e.value.errno == errno.EIO and "superseded" in str(e.value)
        time.sleep(1)  # part 0 is on hot by now: its region is free for part 1 (200 bytes,
        write_part(other, 7, 1, "new", b"q" * 200)  # more than the idle ones of 100)
        assert coord.commit("run", 7, manifest([300, 200]), parts=2, save="new") == \
            "committed"
        mm, size, _ = coord.open_part("run", 7, 0)  # (waits for the step's publication)
        assert mm[:size] == b"n" * 300
        # a writer that aborts its part makes the step impossible: it is dropped
        write_part(coord, 8, 0, "x", b"a" * 10, coordinator=True)
        other.stage("run", 8, 10, part=1, parts=2, save="x")
        other.abort("run", 8, part=1, parts=2, save="x")
        with pytest.raises(PoolRequestError) as e:
            coord.commit("run", 8, manifest([10, 10]), parts=2, save="x")
        assert e.value.errno == errno.EIO and "aborted by its writer" in str(e.value)
        assert steps(coord) == [7]
        # a rank that had not heard of the drop stages its part of the same save: refused,
        # not a fresh step 8 whose part would land in the directory being removed
        with Checkpointer(tierd.socket) as late:
            with pytest.raises(PoolRequestError) as e:
                late.stage("run", 8, 10, part=1, parts=2, save="x")
            assert e.value.errno == errno.EIO and "aborted" in str(e.value)
        write_part(coord, 8, 0, "y", b"b" * 10, coordinator=True)  # a new save may
        write_part(other, 8, 1, "y", b"c" * 10)
        assert coord.commit("run", 8, manifest([10, 10]), parts=2, save="y") == "committed"
