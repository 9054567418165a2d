"""``tierctl`` end to end against a real daemon: the tables people read hold the API's
values, ``--json`` is the API's document, and every error is one line on stderr with a
non-zero exit and no traceback."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from admin.conftest import Admin
from tierd_client.cli_common import human_bytes

from .conftest import FILES, run_ctl

DS = "dset/set/"
TOTAL = sum(FILES.values())


def ok(a: Admin, *args: str) -> str:
    r = a.tierctl(*args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar and no noise off a terminal
    return r.stdout


def fails(r: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The one error line (and nothing on stdout)."""
    assert r.returncode != 0 and (code is None or r.returncode == code), (r.returncode,
                                                                          r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tierctl: "), r.stderr
    assert r.stdout == ""
    return lines[0]


def api(a: Admin, path: str) -> Any:
    status, doc = a.call("GET", path)
    assert status == 200, doc
    return doc


def table(text: str) -> list[list[str]]:
    """Rows of a tierctl table (columns are at least two blanks apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def keyed(rows: list[list[str]]) -> dict[str, list[str]]:
    return {r[0]: r for r in rows}


def put_stuck_file(a: Admin, cold: Path, name: str = "x") -> None:
    """A file the persister can never upload (``stk/NAME/y``: an object in cold where its
    parent directory must go): it stays dirty and queued, and a persist job on it waits
    through the persister's retries (about 15 s) before it fails, naming the file."""
    s3 = a.d.client()
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket="stk")
    s3.put_object(Bucket="stk", Key=f"{name}/y", Body=b"z" * 1000)
    (cold / "stk").mkdir(exist_ok=True)
    (cold / "stk" / name).write_bytes(b"in the way")


def test_status_shows_tiers_queue_cold_requests_and_pool(ctl: tuple[Admin, Path]) -> None:
    a, cold = ctl
    put_stuck_file(a, cold)
    doc = json.loads(ok(a, "status", "--json"))
    st = api(a, "/v1/status")
    assert doc["pid"] == st["pid"] == a.d.proc.pid and doc["data_dir"] == str(a.data)
    assert doc["placement"]["tiers"] == st["placement"]["tiers"]
    assert set(doc["placement"]["tiers"]) == {"mem", "hot", "warm"}
    queue = doc["placement"]["queue"]
    assert queue["depth"] >= 1 and queue["oldest_age_seconds"] >= 0
    assert doc["placement"]["dirty"]["bytes"] >= 1000
    cold_doc = doc["placement"]["cold"]
    assert cold_doc["url"] == f"file://{cold}" and cold_doc["reachable"] is True
    assert cold_doc["reason"] is None and cold_doc["pending_deletes"] >= 0
    assert doc["requests"]["s3"] >= 2 and "admin" in doc["requests"]

    text = ok(a, "status")
    rows = table(text)
    fields = keyed(rows)
    assert fields["tierd"][2] == f"pid {a.d.proc.pid}"
    assert fields["data dir"][1] == str(a.data)
    tiers = {r[0]: r for r in rows[rows.index(["TIER", "USED", "CAPACITY", "USE"]) + 1:]
             if r[0] in ("mem", "hot", "warm", "cold")}
    for name, t in st["placement"]["tiers"].items():
        assert tiers[name][1:3] == [human_bytes(t["used"]), human_bytes(t["capacity"])]
        pct = round(100 * t["used"] / t["capacity"])
        assert re.fullmatch(rf"[█░#.]+ {pct}%", tiers[name][3]), tiers[name]
    assert tiers["mem"][2] == "64.0 MiB"
    assert tiers["cold"][3:] == ["reachable", f"file://{cold}"]
    dirty = fields["dirty"][1]
    assert f"persist queue {queue['depth']} files, oldest" in dirty, dirty
    assert dirty.startswith(human_bytes(doc["placement"]["dirty"]["bytes"]) + " dirty")
    requests = " ".join(fields["requests"][1:])
    assert re.search(r"admin (\d+)", requests) and "s3 " in requests and "fuse " in requests
    assert "64.0 MiB used, 0 regions" in " ".join(fields["pool"][1:])
    stats = doc["placement"]["stats"]
    assert fields["reads"][1].startswith(
        f"hits {stats.get('hits', 0)}, misses {stats.get('misses', 0)}")

    rated = ok(a, "status", "--rate")
    assert re.search(r"s3 \d+ \(\d+\.\d/s\)", rated), rated


def test_placement_commands_and_jobs(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    imported = json.loads(ok(a, "import", DS, "--json"))
    assert imported["imported"] >= len(FILES)
    assert re.fullmatch(r"imported \d+ entries\n", ok(a, "import", DS))

    out = ok(a, "warmup", DS)
    assert out == f"warmed {human_bytes(TOTAL)} in {len(FILES)} files under {DS}\n"
    du = json.loads(ok(a, "du", DS, "--json"))
    assert du == api(a, f"/v1/placement/du?prefix={DS}")
    assert du["files"] == len(FILES) and du["tiers"]["hot"] == TOTAL
    header, row = table(ok(a, "du", DS))
    cols = dict(zip(header, row, strict=True))
    assert cols == {"PREFIX": DS, "FILES": str(len(FILES)), "BYTES": human_bytes(TOTAL),
                    "MEM": "0 B", "HOT": human_bytes(TOTAL), "WARM": "0 B",
                    "COLD": human_bytes(du["tiers"]["cold"]), "DIRTY": "0 B"}

    sub = FILES["set/sub/c.bin"]
    assert ok(a, "evict", DS + "sub/", "--tier", "hot") == f"evicted {human_bytes(sub)}\n"
    job = json.loads(ok(a, "evict", DS + "sub/", "--tier", "warm", "--json"))
    assert job["state"] == "done" and job["kind"] == "evict"
    assert job["result"]["evicted"] == sub and job["result"]["tiers"]["warm"] == sub
    assert job == api(a, f"/v1/jobs/{job['id']}")

    assert ok(a, "persist", DS) == f"{DS}: persisted\n"
    job = json.loads(ok(a, "persist", DS, "--wait-timeout", "30", "--json"))
    assert job["state"] == "done" and job["result"] == {"prefix": DS, "persisted": True}

    assert ok(a, "pin", DS) == f"pinned {DS}\n"
    policies = json.loads(ok(a, "policy", "get", "--json"))
    assert policies == api(a, "/v1/placement/policy")
    assert [DS, "write-back", "yes", "hot"] in table(ok(a, "policy", "get"))
    assert ok(a, "unpin", DS) == f"unpinned {DS}\n"
    set_out = table(ok(a, "policy", "set", DS, "--tier", "warm"))
    assert set_out == [["PREFIX", "MODE", "PIN", "TIER"], [DS, "write-back", "no", "warm"]]
    assert json.loads(ok(a, "policy", "set", DS, "--tier", "hot", "--json"))["tier"] == "hot"

    # a detached job, then followed and inspected
    ok(a, "evict", DS)
    out = ok(a, "warmup", DS, "--detach")
    m = re.fullmatch(r"started job ([0-9a-f]+) \(warmup dset/set/\): tierctl job show \1\n", out)
    assert m, out
    jid = m.group(1)
    job = json.loads(ok(a, "job", "show", jid, "--wait", "--json"))
    assert job["state"] == "done" and job["done"] == job["total"] == TOTAL
    shown = keyed(table(ok(a, "job", "show", jid)))
    assert shown["state"] == ["state", "done"] and shown["kind"] == ["kind", f"warmup {DS}"]
    assert shown["progress"][1] == (f"{human_bytes(TOTAL)} / {human_bytes(TOTAL)} "
                                    f"({len(FILES)}/{len(FILES)} files)")
    listing = table(ok(a, "job", "list", "--state", "done"))
    assert listing[0][:5] == ["ID", "KIND", "PREFIX", "TIER", "STATE"]
    assert keyed(listing[1:])[jid][1:5] == ["warmup", DS, "-", "done"]
    assert json.loads(ok(a, "job", "list", "--state", "done", "--json")) == api(
        a, "/v1/jobs?state=done")
    assert ok(a, "job", "cancel", jid) == f"job {jid}: done\n"  # finished: stays done


def _default_sigint() -> None:
    """Ctrl-C as on a terminal: a suite started in the background (``cmd &`` in a
    non-interactive shell) passes SIGINT ignored to its children, and Python keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_the_job_being_waited_for(ctl: tuple[Admin, Path]) -> None:
    a, cold = ctl
    # a file of its own: one an earlier test left may already be past its retries, and a
    # job on that fails at once instead of waiting
    name = f"c{uuid.uuid4().hex[:8]}"
    put_stuck_file(a, cold, name)
    proc = subprocess.Popen([sys.executable, "-m", "tierd_client.tierctl", "--data-dir",
                             str(a.data), "persist", f"stk/{name}/"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 30
        running: list[dict[str, Any]] = []
        while not running:
            assert time.monotonic() < deadline, "the persist job never ran"
            time.sleep(0.1)
            # running for a while: tierctl is past starting it, in its wait loop
            running = [j for j in api(a, "/v1/jobs?state=running")["jobs"]
                       if j["kind"] == "persist" and j["prefix"] == f"stk/{name}/"
                       and j["elapsed_s"] >= 0.5]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    line = fails(r, 130)
    assert f"interrupted: job {running[0]['id']} cancelled" in line, line
    assert api(a, f"/v1/jobs/{running[0]['id']}")["state"] == "cancelled"


def test_pool_and_ckpt(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    fields = keyed(table(ok(a, "pool", "status")))
    assert fields["used"][-1] == "0 B of 64.0 MiB" and fields["regions"] == ["regions", "0"]
    out = ok(a, "pool", "quota", "set", "4321", "8MiB")
    assert out == "tenant 4321: quota 8.0 MiB, using 0 B\n"
    assert ["4321", "0 B", "8.0 MiB", "0"] in table(ok(a, "pool", "status"))
    assert json.loads(ok(a, "pool", "status", "--json")) == api(a, "/v1/pool")
    doc = json.loads(ok(a, "pool", "quota", "set", "4321", "0", "--json"))
    assert doc["quota"] != 8 << 20
    assert ok(a, "ckpt", "list", "nothing") == "checkpoints/nothing: no checkpoints\n"
    assert json.loads(ok(a, "ckpt", "list", "nothing", "--json")) == api(
        a, "/v1/ckpt?run=nothing&bucket=checkpoints")


def test_users_and_keys_json_is_the_api(ctl: tuple[Admin, Path]) -> None:
    a, _ = ctl
    name = f"u{uuid.uuid4().hex[:6]}"
    added = json.loads(ok(a, "user", "add", name, "--uid", "3100", "--admin", "--json"))
    assert added["name"] == name and added["admin"] is True
    assert json.loads(ok(a, "user", "list", "--json")) == api(a, "/v1/users")
    row = keyed(table(ok(a, "user", "list")))[name]
    assert row[1:6] == ["3100", "3100", "-", "yes", "0"]
    key = json.loads(ok(a, "key", "add", name, "--json"))
    assert json.loads(ok(a, "key", "list", "--json")) == api(a, "/v1/keys")
    assert keyed(table(ok(a, "key", "list")))[key["access_key"]][1:3] == [name, "enabled"]
    assert json.loads(ok(a, "key", "disable", key["access_key"], "--json"))["enabled"] is False
    assert keyed(table(ok(a, "key", "list", "--user", name)))[key["access_key"]][2] == \
        "disabled"
    removed = json.loads(ok(a, "user", "rm", name, "--json"))
    assert removed["keys_removed"] == [key["access_key"]]


def test_errors_are_one_line_with_a_non_zero_exit(ctl: tuple[Admin, Path],
                                                  tmp_path: Path) -> None:
    a, _ = ctl
    # the daemon down: the URL and where it came from
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    line = fails(run_ctl("--admin-url", url, "status"), 1)
    assert f"cannot reach the tierd admin API at {url} (from --admin-url)" in line
    line = fails(run_ctl("user", "list", env={"TIERD_ADMIN_URL": url}), 1)
    assert "(from TIERD_ADMIN_URL)" in line
    line = fails(run_ctl("--data-dir", str(tmp_path / "none"), "health"), 1)
    assert f"{tmp_path / 'none' / 'endpoints.json'} does not exist" in line

    # a wrong token, and no token where tierctl looked for one
    line = fails(a.tierctl("--token", "not-the-token-0123456789", "status"), 1)
    assert "HTTP 401" in line and "--token was refused" in line
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "endpoints.json").write_text((a.data / "endpoints.json").read_text())
    line = fails(run_ctl("--data-dir", str(elsewhere), "status"), 1)
    assert "HTTP 401" in line and f"{elsewhere / 'admin-token'} does not exist" in line

    # the API's own messages
    assert "no user 'nobody-here'" in fails(a.tierctl("user", "rm", "nobody-here"), 1)
    assert "no user" in fails(a.tierctl("key", "add", "nobody-here"), 1)
    assert "no job 'feed'" in fails(a.tierctl("job", "show", "feed"), 1)
    assert "HTTP 404" in fails(a.tierctl("pool", "free", "987654"), 1)

    # bad arguments: usage errors, exit 2, still one line
    line = fails(a.tierctl("pool", "quota", "set", "1", "lots"), 2)
    assert "'lots' is not a size" in line and "pool quota set --help" in line
    assert "--uid" in fails(a.tierctl("user", "add", "x"), 2)
    assert "--groups" in fails(a.tierctl("user", "add", "x", "--uid", "5", "--groups", "a"), 2)
    assert "'bogus'" in fails(a.tierctl("warmup", DS, "--tier", "bogus"), 2)
    assert "No such command 'nope'" in fails(a.tierctl("nope"), 2)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_that_completes(shell: str) -> None:
    r = run_ctl("completion", shell)
    assert r.returncode == 0 and "_TIERCTL_COMPLETE" in r.stdout, r.stderr
    assert {"bash": "complete -o nosort -F", "zsh": "compdef", "fish": "complete --no-files"
            }[shell] in r.stdout


def test_completion_completes_commands_and_choices() -> None:
    r = run_ctl(env={"_TIERCTL_COMPLETE": "bash_complete", "COMP_WORDS": "tierctl po",
                     "COMP_CWORD": "1"})
    assert r.returncode == 0
    assert {"plain,pool", "plain,policy"} <= set(r.stdout.split()), r.stdout
    r = run_ctl(env={"_TIERCTL_COMPLETE": "bash_complete",
                     "COMP_WORDS": "tierctl evict x --tier ", "COMP_CWORD": "4"})
    assert {"plain,all", "plain,mem", "plain,hot", "plain,warm"} <= set(r.stdout.split())
