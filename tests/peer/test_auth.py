"""Request signing: what the signature covers, and that nothing secret is logged."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from tierd.meta.store import MetaStore
from tierd.peer import auth

from .conftest import SECRET, Held, running_door

Q = {"version": "3", "offset": "0", "length": "10"}


def _verify(headers: dict[str, str], query: dict[str, str] = Q, path: str = "/v1/data/7",
            *, secret: str = SECRET, now: float = 1_000_000.0) -> str:
    return auth.verify(secret, "GET", path, query.items(), headers, now=now)


def test_a_signature_verifies_and_names_its_node() -> None:
    h = auth.sign(SECRET, "n2", "GET", "/v1/data/7", Q, now=1_000_000.0)
    assert h[auth.HDR_AUTH].startswith("TIERD-HMAC ") and h[auth.HDR_DATE] == "1000000"
    assert _verify(h) == "n2"
    # the query's order does not matter; every field does
    assert _verify(h, dict(reversed(list(Q.items())))) == "n2"
    for changed in ({**Q, "length": "11"}, {**Q, "extra": "1"},
                    {k: v for k, v in Q.items() if k != "offset"}):
        with pytest.raises(auth.AuthError) as err:
            _verify(h, changed)
        assert err.value.status == 403
    for kwargs in ({"path": "/v1/data/8"}, {"secret": SECRET + "x"}):
        with pytest.raises(auth.AuthError) as err:
            _verify(h, **kwargs)  # type: ignore[arg-type]
        assert err.value.status == 403
    with pytest.raises(auth.AuthError):
        auth.verify(SECRET, "POST", "/v1/data/7", Q.items(), h, now=1_000_000.0)


def test_fields_cannot_be_shifted_between_each_other() -> None:
    """Each field on its own line, the query percent-encoded: no two requests share the
    string a signature covers."""
    a = auth.canonical("GET", "/p", [("a", "1&b=2")], "n1", 5)
    b = auth.canonical("GET", "/p", [("a", "1"), ("b", "2")], "n1", 5)
    c = auth.canonical("GET", "/p\n", [], "n1", 5)
    d = auth.canonical("GET", "/p", [("\n", "")], "n1", 5)
    assert len({a, b, c, d}) == 4


def test_the_date_window_is_both_ways() -> None:
    h = auth.sign(SECRET, "n2", "GET", "/v1/data/7", Q, now=1_000_000.0)
    assert _verify(h, now=1_000_000.0 + auth.MAX_SKEW_S) == "n2"
    assert _verify(h, now=1_000_000.0 - auth.MAX_SKEW_S) == "n2"
    for now in (1_000_001.0 + auth.MAX_SKEW_S, 999_999.0 - auth.MAX_SKEW_S):
        with pytest.raises(auth.AuthError) as err:
            _verify(h, now=now)
        assert err.value.status == 403


async def test_neither_the_secret_nor_a_signature_is_logged(
        meta: MetaStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    path = "/v1/data/7"
    async with running_door(meta, Held({7: (3, b"x" * 10)})) as door:
        good = auth.sign(SECRET, "n2", "GET", path, Q)
        wrong = auth.sign("another-secret-xyz", "n2", "GET", path, Q)
        stale = auth.sign(SECRET, "n2", "GET", path, Q, now=1.0)
        async with aiohttp.ClientSession() as s:
            for headers in (good, wrong, stale, {}):
                async with s.get(door.url + path, params=Q, headers=headers) as r:
                    await r.read()
    assert "refused" in caplog.text  # the refusals were logged ...
    for secret in (SECRET, "another-secret-xyz", *(h[auth.HDR_AUTH].split()[1]
                                                   for h in (good, wrong, stale))):
        assert secret not in caplog.text  # ... without what proves or forges a request
