"""deploy/monitoring against a running daemon: the Grafana dashboard, the Prometheus alert
rules and their unit tests, and the scrape configuration.

* Every PromQL expression (dashboard targets, alert rules) names only metrics the daemon's
  ``/metrics`` really exports (read here from a running daemon, with the read-only token,
  as Prometheus reads it), and has the shape of PromQL; the dashboard's layout and
  variables hold together.
* With Debian's ``prometheus`` package (installed, or downloaded with ``apt-get download``
  and unpacked into pytest's cache -- nothing installed, no service started):
  ``promtool check rules`` on the alerts and on the dashboard's expressions,
  ``promtool test rules`` (each alert fires on the situation it names and not on a healthy
  neighbour), ``promtool check config``; and a real Prometheus scrapes the daemon with the
  configuration as shipped (read-only token), evaluates every dashboard expression, and
  turns TierdColdStoreUnreachable pending once the cold store is stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from moto_server import MotoServer, free_port
from prometheus_client.parser import text_string_to_metric_families
from s3.conftest import Daemon, start_daemon

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "deploy" / "monitoring"
DASHBOARD = MON / "grafana-dashboard.json"
ALERTS = MON / "tierd-alerts.yml"
ALERT_TESTS = MON / "tierd-alerts.test.yml"
SCRAPE = MON / "prometheus.yml"
#: Prometheus's own per-target series (not tierd's): TierdDown watches it
PROMETHEUS_OWN = {"up"}
#: Grafana's variables that need no definition in the dashboard
GRAFANA_BUILTIN = {"__rate_interval", "__interval", "__range"}


# -- reading PromQL -------------------------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "and", "or", "unless", "inf", "nan"}
_FUNCTIONS = {"sum", "min", "max", "avg", "count", "rate", "irate", "increase",
              "histogram_quantile", "topk", "bottomk", "abs", "clamp_min", "clamp_max"}
_MATCHER = re.compile(r'\s*[a-zA-Z_]\w*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (functions, keywords, label names, strings,
    ranges and grouping lists left out)."""
    s = _without_strings(expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0) in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def promql_shape_problems(expr: str) -> list[str]:
    """What makes ``expr`` not look like PromQL (the check when promtool is missing; it
    also runs beside promtool): brackets, functions, label matchers."""
    problems = []
    s = _without_strings(expr)
    stack: list[str] = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}" and (not stack or "([{"[")]}".index(ch)] != stack.pop()):
            problems.append(f"unbalanced {ch!r}")
            break
    if stack:
        problems.append(f"unclosed {stack[-1]!r}")
    for fn in re.findall(r"([A-Za-z_]\w*)\s*\(", s):
        if fn not in _FUNCTIONS | {"by", "without", "on", "ignoring"}:
            problems.append(f"unknown function {fn}")
    for inner in re.findall(r"\{([^}]*)\}", expr):
        for part in filter(None, inner.split(",")):
            if not _MATCHER.fullmatch(part):
                problems.append(f"bad label matcher {part!r}")
    for rng in re.findall(r"\[([^\]]*)\]", expr):
        if not re.fullmatch(r"\d+[smhdw]|\$__\w+", rng.strip()):
            problems.append(f"bad range [{rng}]")
    return problems


def test_promql_readers_see_what_they_should() -> None:
    expr = ('sum by (door) (rate(tierd_requests_total{status=~"5xx|EIO",door!="x"}'
            '[$__rate_interval])) / on (door) other:metric > bool 0.05 and up')
    assert metric_names(expr) == {"tierd_requests_total", "other:metric", "up"}
    assert promql_shape_problems(expr) == []
    assert promql_shape_problems("rate(x[5m]") == ["unclosed '('"]
    assert promql_shape_problems('frobnicate(x{a="b", c})') == [
        "unknown function frobnicate", "bad label matcher ' c'"]


# -- the files ------------------------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel id and refId, expression) of every query of the dashboard."""
    return [(f"p{p['id']}_{t['refId']}", t["expr"]) for p in dashboard()["panels"]
            for t in p.get("targets", [])]


def substituted(expr: str) -> str:
    """A dashboard expression as Grafana sends it (variables filled in)."""
    return expr.replace("$__rate_interval", "1m").replace("$instance", ".*")


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_dashboard_is_a_grafana_dashboard() -> None:
    doc = dashboard()
    assert doc["title"] and doc["uid"] and isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = doc["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy") and g["x"] >= 0 and g["x"] + g["w"] <= 24
        boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"], p["title"]))
        if p["type"] == "row":
            continue
        assert p["type"] in ("stat", "gauge", "timeseries"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["description"] and p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"])) - GRAFANA_BUILTIN
            assert used <= set(variables), f"{p['title']}: undefined variables {used}"
    for i, a in enumerate(boxes):  # no two panels overlap
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a[4], b[4])
    for name, expr in dashboard_targets():
        assert promql_shape_problems(expr) == [], (name, expr)


def test_alert_rules_cover_what_operators_must_hear_about() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
        assert promql_shape_problems(r["expr"]) == [], (r["alert"], r["expr"])
    watched = {name: r["expr"] for r in rules for name in metric_names(r["expr"])}
    for metric in ("tierd_cold_store_up", "tierd_persist_queue_oldest_age_seconds",
                   "tierd_dirty_bytes", "tierd_dirty_limit_bytes", "tierd_tier_used_bytes",
                   "tierd_requests_total", "tierd_cold_store_errors_total"):
        assert metric in watched, f"no alert watches {metric}"
    assert 'tier="hot"' in watched["tierd_tier_used_bytes"]
    assert "5xx" in watched["tierd_requests_total"]
    # every alert has a unit test in which it fires
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    fired = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]
             if t["exp_alerts"]}
    assert fired == set(names)


# -- a running daemon -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, own_moto: MotoServer
           ) -> Iterator[Daemon]:
    own_moto.client().create_bucket(Bucket="cold")
    d = start_daemon(tmp_path_factory.mktemp("monitoring") / "data",
                     *own_moto.tierd_args("s3://cold/m"), "--cold-s3-max-attempts", "1",
                     "--persist-delay", "0", "--dirty-limit", "256MiB")
    s3 = d.client()
    s3.create_bucket(Bucket="mon")
    s3.put_object(Bucket="mon", Key="a", Body=b"x" * 100_000)
    s3.get_object(Bucket="mon", Key="a")["Body"].read()
    yield d
    d.stop()
    assert "Traceback" not in d.log.read_text(errors="replace")


def admin_url(d: Daemon) -> str:
    return str(json.loads((d.data_dir / "endpoints.json").read_text())["admin"]["url"])


@pytest.fixture(scope="module")
def exported(daemon: Daemon) -> set[str]:
    """Every series name the daemon's /metrics has (read with the read-only token)."""
    token = (daemon.data_dir / "read-token").read_text().strip()
    req = urllib.request.Request(admin_url(daemon) + "/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    names: set[str] = set()
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                "histogram": ("_bucket", "_count", "_sum", "_created")}
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    assert "tierd_requests_total" in names and "tierd_dirty_limit_bytes" in names
    return names


def test_dashboard_queries_only_exported_metrics(exported: set[str]) -> None:
    seen: set[str] = set()
    for name, expr in dashboard_targets():
        names = metric_names(expr)
        assert names, f"{name} selects no metric: {expr}"
        assert names <= exported, f"{name} names metrics tierd does not export: " \
                                  f"{names - exported}"
        seen |= names
    # the dashboard shows the tiers, write-back, cold store, doors, pool and checkpoints
    assert {"tierd_tier_used_bytes", "tierd_dirty_bytes", "tierd_persist_queue_depth",
            "tierd_cold_store_up", "tierd_requests_total", "tierd_pool_used_bytes",
            "tierd_checkpoint_duration_seconds_bucket"} <= seen


def test_alerts_name_only_exported_metrics(exported: set[str]) -> None:
    for r in alert_rules():
        names = metric_names(r["expr"])
        # only TierdDown watches Prometheus's series alone (a dead daemon exports nothing)
        assert names - PROMETHEUS_OWN or (r["alert"] == "TierdDown" and names == {"up"})
        assert names <= exported | PROMETHEUS_OWN, (r["alert"], names - exported)


# -- Prometheus's own tools -----------------------------------------------------------------

def _unpack_prometheus(into: Path) -> str | None:
    """Debian's prometheus package unpacked into ``into`` (no install, no service): None,
    or why it could not be had."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return "apt-get/dpkg-deb missing (not a Debian system)"
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(["apt-get", "download", "prometheus"], cwd=tmp,
                             capture_output=True, text=True, timeout=300)
        debs = list(Path(tmp).glob("prometheus_*.deb"))
        if got.returncode != 0 or not debs:
            return f"apt-get download prometheus failed: {got.stderr.strip()[-300:]}"
        unpacked = Path(tmp) / "x"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True,
                       timeout=120)
        into.mkdir(parents=True, exist_ok=True)
        for tool in ("promtool", "prometheus"):
            shutil.copy2(unpacked / "usr" / "bin" / tool, into / tool)
    return None


@pytest.fixture(scope="module")
def prom(request: pytest.FixtureRequest) -> dict[str, str]:
    """Paths of ``promtool`` and ``prometheus``: installed ones, else Debian's package
    unpacked into pytest's cache.  Skips (saying why) only if neither can be had."""
    installed = {t: shutil.which(t) for t in ("promtool", "prometheus")}
    if all(installed.values()):
        return {t: str(p) for t, p in installed.items()}
    cache = getattr(request.config, "cache", None)
    where = (Path(cache.mkdir("debian-prometheus")) if cache is not None
             else Path(tempfile.gettempdir()) / "tierd-test-debian-prometheus")
    if not (where / "promtool").exists() or not (where / "prometheus").exists():
        why = _unpack_prometheus(where)
        if why is not None:
            pytest.skip(f"Prometheus's tools are not available: {why}")
    return {t: str(where / t) for t in ("promtool", "prometheus")}


def promtool(prom: dict[str, str], *args: str, cwd: Path = MON) -> str:
    done = subprocess.run([prom["promtool"], *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_promtool_checks_and_unit_tests_the_alert_rules(prom: dict[str, str]) -> None:
    assert f"SUCCESS: {len(alert_rules())} rules found" in promtool(
        prom, "check", "rules", ALERTS.name)
    assert "SUCCESS" in promtool(prom, "test", "rules", ALERT_TESTS.name)


def test_promtool_parses_every_dashboard_query(prom: dict[str, str], tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"tierd_dashboard:{name}", "expr": substituted(expr)}
        for name, expr in dashboard_targets()]}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    out = promtool(prom, "check", "rules", "dashboard.yml", cwd=tmp_path)
    assert f"SUCCESS: {len(dashboard_targets())} rules found" in out


@contextlib.contextmanager
def prometheus(prom: dict[str, str], d: Daemon, where: Path) -> Iterator[str]:
    """A Prometheus server scraping ``d`` with deploy/monitoring/prometheus.yml as shipped,
    but for the target, the token file (a copy of the daemon's read-only token) and 1 s
    intervals."""
    cfg = yaml.safe_load(SCRAPE.read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(MON / f) for f in cfg["rule_files"]]
    job = cfg["scrape_configs"][0]
    token = where / "tierd-read-token"
    token.write_text((d.data_dir / "read-token").read_text())
    token.chmod(0o600)
    job["authorization"]["credentials_file"] = str(token)
    job["static_configs"] = [{"targets": [admin_url(d).removeprefix("http://")]}]
    (where / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    promtool(prom, "check", "config", "prometheus.yml", cwd=where)
    port = free_port()
    log = (where / "prometheus.log").open("wb")
    proc = subprocess.Popen([prom["prometheus"], "--config.file=prometheus.yml",
                             f"--storage.tsdb.path={where / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], cwd=where,
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        proc.kill()  # (a no-op once it has exited)
        proc.wait()
        log.close()


def query(base: str, expr: str) -> dict[str, Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            doc: dict[str, Any] = json.loads(r.read())
    except (OSError, ValueError) as e:  # not listening yet
        return {"status": "unreachable", "error": str(e)}
    return doc


def first_result(base: str, expr: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The first non-empty answer to ``expr`` (Prometheus scrapes and evaluates every 1 s)."""
    deadline = time.monotonic() + timeout
    while not (found := query(base, expr).get("data", {}).get("result")):
        assert time.monotonic() < deadline, f"Prometheus never answered {expr}"
        time.sleep(0.5)
    return list(found)


def test_prometheus_scrapes_with_the_read_token_and_raises_the_cold_alert(
        prom: dict[str, str], daemon: Daemon, own_moto: MotoServer, tmp_path: Path) -> None:
    with prometheus(prom, daemon, tmp_path) as base:
        first_result(base, 'up{job="tierd"} == 1')  # scraped with the read-only token
        [limit] = query(base, "tierd_dirty_limit_bytes")["data"]["result"]
        assert float(limit["value"][1]) == 256 << 20
        # every dashboard query runs on real data
        for name, expr in dashboard_targets():
            answer = query(base, substituted(expr))
            assert answer["status"] == "success", (name, answer)
        assert query(base, 'ALERTS{alertname="TierdColdStoreUnreachable"}')["data"][
            "result"] == []
        own_moto.stop()
        daemon.client().put_object(Bucket="mon", Key="while-down", Body=b"y" * 1000)
        pending = first_result(
            base, 'ALERTS{alertname="TierdColdStoreUnreachable",alertstate="pending"}', 90)
        assert pending[0]["metric"]["severity"] == "critical"
        assert os.path.exists(tmp_path / "tsdb")
