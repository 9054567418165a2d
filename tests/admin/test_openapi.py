"""The admin API against its OpenAPI document: the document covers exactly the daemon's
routes, is served behind the token, and schemathesis finds no server error, undocumented
status, wrong content type or answer outside its schema on any operation of a real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from s3.conftest import ROOT_KEY
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tierd.admin import AdminAuth, make_admin_app
from tierd.admin.openapi import DOCUMENT, served, undocumented, unregistered
from tierd.config import Config
from tierd.daemon import Daemon

from .conftest import Admin, start_admin

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
#: examples per operation and generation mode: ~37 operations, well under a minute
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 15}


def daemon_app(tmp_path: Path) -> Any:
    """The admin application exactly as ``Daemon`` builds it (not started: routes only)."""
    d = Daemon(Config(data_dir=tmp_path / "data"))
    app = make_admin_app(d, AdminAuth("t" * 32, None))
    from tierd.admin.metrics import instrument_admin

    instrument_admin(app, d.metrics)
    return app


def test_every_route_is_documented_and_every_operation_routed(tmp_path: Path) -> None:
    app = daemon_app(tmp_path)
    assert undocumented(app) == []
    assert unregistered(app) == []
    doc = served(app)
    assert doc["paths"] == DOCUMENT["paths"]
    ops = [(m, p) for p, o in doc["paths"].items() for m in o]
    assert ("post", "/v1/jobs") in ops and ("put", "/v1/buckets/{name}/policy") in ops
    assert len(ops) >= 37
    for path, o in doc["paths"].items():
        for method, op in o.items():
            assert op["responses"], (method, path)
            if path != "/healthz":
                assert "401" in op["responses"], (method, path)  # the token is needed


def test_document_is_valid_openapi() -> None:
    schemathesis.openapi.from_dict(DOCUMENT).validate()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admin]:
    a = start_admin(tmp_path_factory.mktemp("openapi") / "data")
    s3 = a.d.client()
    s3.create_bucket(Bucket="docs")
    s3.put_object(Bucket="docs", Key="a/b.txt", Body=b"hello")
    yield a
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def test_served_document_needs_the_token(live: Admin) -> None:
    status, err = live.call("GET", "/v1/openapi.json", token=None)
    assert status == 401 and err["error"] == "unauthorized"
    status, doc = live.call("GET", "/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert set(doc["paths"]) == set(DOCUMENT["paths"])


def exercise(live: Admin, op: Any, mode: GenerationMode, n: int, session: requests.Session,
             auth: dict[str, str], calls: dict[str, int],
             path_parameters: dict[str, str] | None = None) -> None:
    """``n`` generated requests to one operation, each checked with :data:`CHECKS`
    (with ``path_parameters`` fixed when given)."""

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(op.as_strategy(generation_mode=mode,
                                        path_parameters=path_parameters))
        calls[op.label] = calls.get(op.label, 0) + 1
        case.call_and_validate(base_url=live.url, session=session, headers=auth,
                               checks=CHECKS, timeout=30)

    run()


def test_schemathesis_checks_every_operation(live: Admin) -> None:
    auth = {"Authorization": f"Bearer {live.token}"}
    schema = schemathesis.openapi.from_url(live.url + "/v1/openapi.json", headers=auth)
    session = requests.Session()
    failures: list[str] = []
    calls: dict[str, int] = {}
    operations = [r.ok() for r in schema.get_all_operations()]
    # every operation but the document itself (schemathesis leaves out the URL it loaded)
    assert {op.label for op in operations} == {
        f"{m.upper()} {p}" for p, o in DOCUMENT["paths"].items() for m in o} - {
        "GET /v1/openapi.json"}
    for op in operations:
        # generated names find nothing: the bucket operations also run on a real bucket,
        # so generated policies reach the policy parser
        fixed = [None, {"name": "docs"}] if op.path.startswith("/v1/buckets/{") else [None]
        for (mode, n), params in ((m, p) for m in EXAMPLES.items() for p in fixed):
            try:
                exercise(live, op, mode, n, session, auth, calls, params)
            except Unsatisfiable:
                pass  # nothing to get wrong (GET /healthz has no input to break)
            except (Exception, BaseExceptionGroup) as e:  # one per operation and mode
                failures.append(f"{mode.value} {op.label}: {type(e).__name__}: {e}")
    assert not failures, "\n\n".join(failures[:12])
    assert len(calls) == len(operations) and sum(calls.values()) > 10 * len(operations)
    # the daemon is still whole afterwards: the root key works over S3
    assert live.d.client().list_objects_v2(Bucket="docs")["KeyCount"] == 1
    status, keys = live.call("GET", "/v1/keys")
    assert status == 200 and ROOT_KEY in json.dumps(keys)


def test_schemathesis_cli_every_phase(live: Admin, tmp_path: Path) -> None:
    """The CLI as an operator would run it (docs/admin-api.md): its coverage phase (edge
    values of every parameter), fuzzing and stateful phases (ids one answer gives another)
    find what the fuzzing above may not."""
    cli = Path(sys.executable).parent / "schemathesis"
    r = subprocess.run(
        [str(cli), "run", live.url + "/v1/openapi.json", "-H",
         f"Authorization: Bearer {live.token}", "--checks", ",".join(c.__name__ for c in CHECKS),
         "--max-examples", "15", "--seed", "8", "--generation-database", "none",
         "--request-timeout", "30", "--no-color", "--workers", "1"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    # every operation but the document itself
    tested = sum(len(o) for o in DOCUMENT["paths"].values()) - 1
    assert f"Tested: {tested}" in r.stdout, r.stdout[-3000:]
    # still serving (the stateful phase may have deleted any key it listed, root's too)
    status, doc = live.call("GET", "/v1/status")
    assert status == 200 and doc["buckets"] >= 1
