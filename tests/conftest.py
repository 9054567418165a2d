"""Shared by the suites that need them: running ``async def`` tests without a plugin, one
moto standalone server (a subprocess over HTTP) for the whole session, and hypothesis's CI
profile.

Under CI (``CI`` set, as ``.ci/run`` is run) hypothesis is derandomized: every run tries the
same examples, so a submission's CI result is the one its author saw with ``CI=true
./dev.sh test``, and a newly found counterexample cannot fail an unrelated submission.
Developers' runs stay random (and keep their example database): that is where new
counterexamples are found, then pinned as explicit tests.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings
from moto_server import MotoServer, running_moto

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

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


@pytest.fixture(scope="module")
def own_moto() -> Iterator[MotoServer]:
    """A moto server for one test module alone, for tests that stop it to see a daemon
    lose its cold store (the session's ``moto`` is shared)."""
    with running_moto() as server:
        yield server
