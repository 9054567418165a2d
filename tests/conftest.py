"""Shared by the suites that need them: running ``async def`` tests without a plugin, and
one moto standalone server (a subprocess over HTTP) for the whole session."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator

import pytest
from moto_server import MotoServer, running_moto

#: the bucket of the moto server that cold tiers in tests live in
COLD_BUCKET = "tierd-cold"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh loop, with a deadline so a hang fails the test."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
        asyncio.run(asyncio.wait_for(pyfuncitem.obj(**args), 90))
        return True
    return None


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with running_moto() as server:
        server.client().create_bucket(Bucket=COLD_BUCKET)
        yield server
