"""Request ids in log records (tierd.logs), in process: both formats carry the id of the
request being handled, threads started with ``asyncio.to_thread`` inherit it, explicit fields
win, and records outside a request carry none."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from tierd.logs import get_logger, kv, new_request_id, request_id_var, setup_logging


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    setup_logging("debug", "json", buf)
    try:
        yield buf
    finally:
        for h in list(root.handlers):
            if h not in saved_handlers:
                root.removeHandler(h)
        root.setLevel(saved_level)
        logging.captureWarnings(False)  # setup_logging turned it on: leave pytest's alone


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in buf.getvalue().splitlines()]


def test_json_records_carry_the_request_id(stream: io.StringIO) -> None:
    log = get_logger("test")

    async def handle(rid: str) -> None:
        token = request_id_var.set(rid)
        try:
            log.info("in the handler")
            await asyncio.to_thread(log.info, "in a worker thread")
            await asyncio.sleep(0)
            log.info("explicit", extra=kv(request_id="other"))
        finally:
            request_id_var.reset(token)

    async def main() -> None:
        await asyncio.gather(handle("AAAA000000000001"), handle("BBBB000000000002"))
        log.info("outside")

    asyncio.run(main())
    got = [rec for rec in lines(stream) if rec["component"] == "test"]
    by_id: dict[object, list[object]] = {}
    for rec in got:
        by_id.setdefault(rec.get("request_id"), []).append(rec["msg"])
    assert sorted(by_id["AAAA000000000001"]) == ["in a worker thread", "in the handler"]
    assert sorted(by_id["BBBB000000000002"]) == ["in a worker thread", "in the handler"]
    assert by_id["other"] == ["explicit", "explicit"]
    assert by_id[None] == ["outside"]


def test_text_format_and_new_ids(stream: io.StringIO) -> None:
    buf = io.StringIO()
    setup_logging("info", "text", buf)
    rid = new_request_id()
    assert len(rid) == 16 and rid == rid.upper() and int(rid, 16) >= 0
    assert new_request_id() != rid
    token = request_id_var.set(rid)
    try:
        get_logger("test").warning("refused")
    finally:
        request_id_var.reset(token)
    line = buf.getvalue().strip()
    assert f"request_id={rid}" in line and "component=test" in line
