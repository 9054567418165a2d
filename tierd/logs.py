"""Structured logging on top of stdlib :mod:`logging`.

Why stdlib: every library tierd uses (aiohttp, asyncio, boto3) already logs through it, so one
handler on the root logger formats all of it the same way.  Two formats:

* ``text``: ``ts=2024-05-01T12:00:00.123Z level=info component=daemon msg="listening"
  door=s3 address=127.0.0.1:9000`` -- key=value, greppable, readable in a terminal;
* ``json``: one JSON object per line with the same keys, for log shippers.

Every record carries a **component**: the logger name below ``tierd.`` (``get_logger("s3")``
logs as ``component=s3``); records from other libraries use their logger name
(``component=aiohttp.server``).  Structured fields go in through :func:`kv`::

    log = get_logger("daemon")
    log.info("listening", extra=kv(door="s3", address="127.0.0.1:9000"))

**Request ids**: while a door handles a request, :data:`request_id_var` holds its id (the S3
door's ``x-amz-request-id``, the admin API's ``X-Request-Id``), set by the request middleware
(:func:`tierd.metrics.request_middleware`).  Every record emitted meanwhile -- by tierd or a
library, in the handler or in a thread started with ``asyncio.to_thread`` -- carries
``request_id=...``, so one grep finds everything a failed request did.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from typing import IO, Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

_FIELDS = "tierd_fields"
_RESERVED = ("ts", "level", "component", "msg")

#: the id of the request being handled (None outside requests); see the module docstring
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tierd_request_id", default=None)
#: where a request's id is kept on the aiohttp request (the access log reads it there)
REQUEST_ID = "tierd.request_id"


def new_request_id() -> str:
    """A request id in the S3 style: 16 upper-case hex digits."""
    return os.urandom(8).hex().upper()


def get_logger(component: str) -> logging.Logger:
    """The logger of one tierd component (``daemon``, ``s3``, ``admin``, ``namespace`` ...)."""
    return logging.getLogger(f"tierd.{component}")


def kv(**fields: object) -> dict[str, Any]:
    """Structured fields for one record: pass as ``extra=kv(...)``."""
    return {_FIELDS: fields}


class LogBudget:
    """At most ``burst`` lines per ``window`` seconds of one kind of message, so that a
    client or a store repeating the same refusal cannot flood the log; the first line after
    a spell of left-out ones says how many were left out."""

    def __init__(self, burst: int, window: float) -> None:
        self.burst, self.window = burst, window
        self.start = -window
        self.count = 0
        self.left_out = 0

    def take(self) -> int | None:
        """None: leave this line out.  Else log it, saying how many were left out before
        it when that is not 0."""
        now = time.monotonic()
        if now - self.start >= self.window:
            self.start, self.count = now, 0
        if self.count >= self.burst:
            self.left_out += 1
            return None
        self.count += 1
        left_out, self.left_out = self.left_out, 0
        return left_out


def _component(record: logging.LogRecord) -> str:
    name = record.name
    return name[len("tierd.") :] if name.startswith("tierd.") else name


def _timestamp(record: logging.LogRecord) -> str:
    t = time.gmtime(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    out: dict[str, object] = {
        "ts": _timestamp(record),
        "level": record.levelname.lower(),
        "component": _component(record),
        "msg": record.getMessage(),
    }
    rid = request_id_var.get()
    if rid is not None:
        out["request_id"] = rid
    extra = getattr(record, _FIELDS, None)
    if isinstance(extra, dict):
        for k, v in extra.items():
            out[f"field_{k}" if k in _RESERVED else k] = v
    return out


def _quote(value: object) -> str:
    s = value if isinstance(value, str) else str(value)
    if s and not any(c in s for c in ' "=\\\n\t') and s.isprintable():
        return s
    return json.dumps(s)


class TextFormatter(logging.Formatter):
    """``key=value`` lines; values with spaces, quotes or ``=`` are JSON-quoted."""

    def format(self, record: logging.LogRecord) -> str:
        line = " ".join(f"{k}={_quote(v)}" for k, v in _fields(record).items())
        if record.exc_info:
            line += " exc=" + _quote(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out = _fields(record)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


_HANDLER_MARK = "_tierd_handler"


def setup_logging(level: str = "info", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Route every logger to one handler on ``stream`` (stderr) in the chosen format.

    Idempotent: calling it again replaces tierd's handler instead of adding a second one.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _HANDLER_MARK, False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.captureWarnings(True)


class AccessLogger(AbstractAccessLogger):
    """aiohttp access log as structured ``debug`` records (per-request lines at ``info``
    would drown everything else when health checks poll)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        self.logger.debug(
            "request",
            extra=kv(
                method=request.method,
                path=request.path,
                status=response.status,
                ms=round(time * 1000, 3),
                remote=request.remote,
                # the access line is written after the handler's context is gone
                request_id=request.get(REQUEST_ID, "-"),
            ),
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG)
