"""Asynchronous jobs (``/v1/jobs``): ``tierctl job list/show/cancel``, and the waiting with
a progress bar that ``warmup``, ``evict`` and ``persist`` use.

Waiting polls ``GET /v1/jobs/{id}``; Ctrl-C while waiting cancels the job
(``DELETE /v1/jobs/{id}``) rather than leaving it running unseen -- ``--detach`` is the way
to start one and walk away.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

import click

from .cli_common import (
    AdminClient,
    AdminError,
    echo_json,
    fail,
    human_bytes,
    human_duration,
    print_fields,
    print_table,
    progress,
    when,
)
from .cli_root import cli, json_option

STATES = ("queued", "running", "done", "failed", "cancelled")
#: seconds between two looks at a job being waited for
POLL = 0.25


def jobs_missing(e: AdminError) -> bool:
    """Whether the daemon predates ``/v1/jobs`` (then the synchronous endpoints serve)."""
    return e.status == 404 and "no such endpoint" in str(e)


def start_job(client: AdminClient, doc: dict[str, Any]) -> dict[str, Any] | None:
    """``POST /v1/jobs``; None when this daemon has no jobs API."""
    try:
        return client.call("POST", "/v1/jobs", doc)
    except AdminError as e:
        if jobs_missing(e):
            return None
        raise


def _path(job_id: str) -> str:
    return "/v1/jobs/" + quote(job_id, safe="")


def _describe(job: dict[str, Any]) -> str:
    prefix = job.get("prefix") or "(all)"
    tier = f" {job['tier']}" if job.get("tier") else ""
    return f"{job.get('kind', 'job')}{tier} {prefix}"


def wait_job(client: AdminClient, job: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Follow ``job`` to its end with a progress bar (stderr, terminal only); Ctrl-C cancels
    it.  Returns the finished job; a failed or cancelled job is one error line."""
    job_id = str(job["id"])
    try:
        with progress(_describe(job), quiet) as report:
            while job["state"] in ("queued", "running"):
                report(job.get("done") or 0, job.get("total"), job.get("bytes_per_s"))
                time.sleep(POLL)
                job = client.get_json(_path(job_id))
            report(job.get("done") or 0, job.get("total"), job.get("bytes_per_s"))
    except KeyboardInterrupt:
        try:
            job = client.call("DELETE", _path(job_id))
        except AdminError as e:
            fail(f"interrupted; cancelling job {job_id} failed: {e}", 130)
        fail(f"interrupted: job {job_id} {job.get('state', 'cancelled')} after "
             f"{human_bytes(job.get('done') or 0)}", 130)
    if job["state"] == "failed":
        fail(f"job {job_id} ({_describe(job)}) failed: {job.get('error') or 'unknown error'}")
    if job["state"] == "cancelled":
        fail(f"job {job_id} ({_describe(job)}) was cancelled")
    return job


def detach(job: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(job)
    else:
        click.echo(f"started job {job['id']} ({_describe(job)}): tierctl job show {job['id']}")


def no_jobs_api() -> None:
    fail("this tierd has no jobs API (/v1/jobs): --detach needs a newer daemon")


def _progress_text(job: dict[str, Any]) -> str:
    total = job.get("total")
    done = human_bytes(job.get("done") or 0)
    text = done if total is None else f"{done} / {human_bytes(total)}"
    if job.get("files") is not None:
        text += f" ({job.get('files_done', 0)}/{job['files']} files)"
    return text


@cli.group()
def job() -> None:
    """Asynchronous jobs (warmup, pin, evict, persist): list, show, cancel."""


@job.command("list")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only jobs in STATE.")
@json_option
@click.pass_obj
def job_list(client: AdminClient, state: str | None, as_json: bool) -> None:
    """Jobs, newest first (finished ones until a restart)."""
    doc = client.get_json("/v1/jobs" + ("?" + urlencode({"state": state}) if state else ""))
    if as_json:
        echo_json(doc)
        return
    print_table(("ID", "KIND", "PREFIX", "TIER", "STATE", "PROGRESS", "RATE", "CREATED"), [
        (j["id"], j["kind"], j.get("prefix") or "(all)", j.get("tier") or "-", j["state"],
         _progress_text(j), f"{human_bytes(j.get('bytes_per_s') or 0)}/s",
         when(int((j.get("created") or 0) * 1e9)))
        for j in doc["jobs"]])


@job.command("show")
@click.argument("job_id", metavar="ID")
@click.option("--wait", is_flag=True, help="Follow the job to its end (Ctrl-C cancels it).")
@json_option
@click.pass_obj
def job_show(client: AdminClient, job_id: str, wait: bool, as_json: bool) -> None:
    """One job: state, progress, throughput, ETA, result or error."""
    doc = client.get_json(_path(job_id))
    if wait:
        doc = wait_job(client, doc, quiet=as_json)
    if as_json:
        echo_json(doc)
        return
    eta = doc.get("eta_s")
    rows: list[tuple[str, object]] = [
        ("id", doc["id"]), ("kind", _describe(doc)), ("state", doc["state"]),
        ("progress", _progress_text(doc)),
        ("rate", f"{human_bytes(doc.get('bytes_per_s') or 0)}/s"),
        ("eta", "-" if eta is None else human_duration(eta)),
        ("elapsed", human_duration(doc.get("elapsed_s") or 0)),
        ("by", doc.get("identity") or "-"),
    ]
    if doc.get("error"):
        rows.append(("error", doc["error"]))
    if doc.get("result"):
        rows.append(("result", ", ".join(f"{k}={v}" for k, v in doc["result"].items())))
    print_fields(rows)


@job.command("cancel")
@click.argument("job_id", metavar="ID")
@json_option
@click.pass_obj
def job_cancel(client: AdminClient, job_id: str, as_json: bool) -> None:
    """Stop job ID (the file in progress finishes; a finished job stays as it is)."""
    doc = client.call("DELETE", _path(job_id))
    if as_json:
        echo_json(doc)
        return
    click.echo(f"job {doc['id']}: {doc['state']}")
    if doc["state"] in ("queued", "running"):
        click.echo("(still stopping: see tierctl job show)", err=True)
