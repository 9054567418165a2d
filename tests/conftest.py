"""Shared by the suites that need them: running ``async def`` tests without a plugin, one
moto standalone server (a subprocess over HTTP) for the whole session, hypothesis's CI
profile, and the order of the test files (slowest first).

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

import file_seconds
import pytest
from hypothesis import settings
from moto_server import MotoServer, running_moto

settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

#: the bucket of the moto server that cold tiers in tests live in
COLD_BUCKET = "tierd-cold"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slowest files first (``tests/file_seconds.py`` says why); a stable sort, so each file's
    tests keep their order, and every xdist worker computes the same order."""
    seconds = file_seconds.load()
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0],
                                             file_seconds.DEFAULT_S))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``TIERD_TEST_SECONDS=FILE``, append each phase's time to FILE as it ends (in the
    controlling process only), so a run cut short still says what it measured."""
    out = os.environ.get("TIERD_TEST_SECONDS")
    if out and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(out, "a") as f:
            f.write(f"{report.duration:.3f} {report.nodeid}\n")


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
