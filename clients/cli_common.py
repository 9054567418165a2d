"""What every ``tierctl`` command shares: the admin API client, finding the daemon and its
token, and output (rich tables for people, ``--json`` for scripts, one error line).

It depends only on the standard library, click and rich (not on the daemon package), so
tierctl installs on machines that only administer tierd.  Plain blocking ``urllib`` is right
here: a CLI makes a few requests and exits.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Protocol

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

DEFAULT_ADMIN_URL = "http://127.0.0.1:9001"
TOKEN_FILE = "admin-token"
ENDPOINTS_FILE = "endpoints.json"


class AdminError(Exception):
    """The admin API could not be reached or answered with an error (tierctl's ``main``
    prints it as one line and exits 1).  ``status`` is the HTTP status of an error answer
    (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AdminClient:
    """Minimal client of tierd's admin API.

    ``origin`` says how the URL was found and ``token_hint`` where the token was looked
    for: both go into the error line when the daemon cannot be reached or refuses the token,
    because the usual cause is that tierctl looked in the wrong place.
    """

    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None,
                 token_hint: str = "", origin: str = "") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.token = token
        self.token_hint = token_hint
        self.origin = origin

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _status_error(self, path: str, status: int, message: str) -> AdminError:
        if status == 401 and self.token_hint:
            message = f"{message} -- {self.token_hint}"
        return AdminError(f"{self.url}{path}: HTTP {status}: {message}", status)

    def _unreachable(self, e: BaseException) -> AdminError:
        reason = getattr(e, "reason", e)
        how = f" ({self.origin})" if self.origin else ""
        return AdminError(f"cannot reach the tierd admin API at {self.url}{how}: {reason} "
                          "(is `tierd serve` running? set --admin-url or TIERD_ADMIN_URL)")

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``; returns (status, body).  HTTP errors are returned, not raised."""
        req = urllib.request.Request(self.url + path, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise self._unreachable(e) from None

    def get_json(self, path: str) -> dict[str, Any]:
        status, body = self.get(path)
        try:
            doc = json.loads(body)
        except ValueError:
            raise AdminError(
                f"{self.url}{path}: HTTP {status}, not a JSON answer (is this tierd's admin "
                "listener and not the S3 one?)"
            ) from None
        if status != 200 or not isinstance(doc, dict):
            message = doc.get("message") if isinstance(doc, dict) else None
            text = message or body.decode(errors="replace").strip()
            raise self._status_error(path, status, text)
        return doc

    def send(self, method: str, path: str, doc: dict[str, Any] | None,
             timeout: float | None = None) -> Any:
        """``method path`` with a JSON body; the response, still open (for streaming)."""
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **self._headers()})
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = str(json.loads(raw).get("message", ""))
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace").strip()[:200]
            raise self._status_error(path, e.code, message or e.reason) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise self._unreachable(e) from None

    def call(self, method: str, path: str, doc: dict[str, Any] | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        try:
            with self.send(method, path, doc, timeout) as resp:
                out = json.loads(resp.read())
        except ValueError:
            raise AdminError(f"{self.url}{path}: not a JSON answer") from None
        except OSError as e:  # the connection dropped while reading the answer
            raise self._unreachable(e) from None
        if not isinstance(out, dict):
            raise AdminError(f"{self.url}{path}: the answer is not a JSON object")
        return out

    def health(self) -> tuple[bool, str]:
        status, body = self.get("/healthz")
        return status == 200, body.decode(errors="replace").strip() or f"HTTP {status}"

    def status(self) -> dict[str, Any]:
        return self.get_json("/v1/status")


def default_data_dir() -> Path:
    """The daemon's default data directory (its ``data_dir`` setting's default)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("tierd"))


def find_admin(admin_url: str | None, token: str | None, data_dir: Path | None,
               timeout: float, url_origin: str = "--admin-url",
               token_origin: str = "--token / TIERD_ADMIN_TOKEN") -> AdminClient:
    """The client for the daemon named by the options: ``admin_url``, else the admin URL
    in the data directory's ``endpoints.json``, else the default; ``token``, else the data
    directory's ``admin-token`` file."""
    data = data_dir if data_dir is not None else default_data_dir()
    endpoints = data / ENDPOINTS_FILE
    if admin_url:
        origin = f"from {url_origin}"
    else:
        try:
            admin_url = str(json.loads(endpoints.read_text())["admin"]["url"])
            origin = f"from {endpoints}"
        except FileNotFoundError:
            admin_url = DEFAULT_ADMIN_URL
            origin = (f"the default: {endpoints} does not exist; pass --data-dir or "
                      "--admin-url")
        except (OSError, ValueError, KeyError, TypeError) as e:
            admin_url = DEFAULT_ADMIN_URL
            why = e.strerror if isinstance(e, OSError) else "no admin URL in it"
            origin = f"the default: cannot read {endpoints} ({why})"
    hint = ""
    if not token:
        path = data / TOKEN_FILE
        try:
            token = path.read_text().strip() or None
        except FileNotFoundError:
            hint = (f"no admin token: pass --token or set TIERD_ADMIN_TOKEN (the daemon "
                    f"writes it to DATA_DIR/{TOKEN_FILE}; {path} does not exist: "
                    "use --data-dir)")
        except OSError as e:
            hint = (f"no admin token: cannot read {path} ({e.strerror}); run as the "
                    "daemon's user, or pass --token / set TIERD_ADMIN_TOKEN")
        if token:
            hint = f"the token in {path} was refused (another daemon's data directory?)"
        elif not hint:
            hint = f"no admin token: {path} is empty; pass --token or set TIERD_ADMIN_TOKEN"
    else:
        hint = f"the token given by {token_origin} was refused"
    return AdminClient(admin_url, timeout, token, hint, origin)


# -- sizes and durations ----------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"64GiB"``/``"512M"``/``"4096"`` -> bytes (binary units, as tierd's config)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f'{text!r} is not a size such as "512MiB" or "64G"')
    return int(m.group(1)) << (10 * " kmgtp".index(m.group(2).lower() or " "))


class SizeType(click.ParamType[int]):
    """A click argument type for byte sizes (a bad one is a usage error, exit 2)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeType()


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """3725 -> '1h 2m 5s'."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d"] * bool(d) + [f"{h}h"] * bool(h) + [f"{m}m"] * bool(m) + [f"{s}s"]
    return " ".join(parts[:3])


def when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9)) if ns else "-"


# -- output -----------------------------------------------------------------------------------

def _console(stderr: bool) -> Console:
    """A console without markup or highlighting (names and paths are printed as they are).
    Not on a terminal (a pipe, a test) lines are not wrapped: a long path stays one line
    that grep and ``split()`` find."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, markup=False, highlight=False, emoji=False,
                   width=None if tty else 4096, soft_wrap=not tty)


def out() -> Console:
    return _console(stderr=False)


def err_console() -> Console:
    return _console(stderr=True)


def echo_json(doc: Any) -> None:
    """The raw API document, for scripts."""
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr and a non-zero exit."""
    click.echo(f"tierctl: {' '.join(message.split())}", err=True)
    sys.exit(code)


def make_table(headers: Sequence[str], title: str | None = None) -> Table:
    """A kubectl-like table: a header line, then one line per row, columns separated by
    spaces (no box), first column at the line's start -- readable, and easy for ``awk``."""
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold",
              title=title, title_justify="left", title_style="bold")
    for h in headers:
        t.add_column(h, no_wrap=True, overflow="fold")
    return t


def emit(renderable: Any) -> None:
    """Print a rich renderable on stdout: styled on a terminal; elsewhere plain text with
    no trailing blanks (tables pad their cells), what scripts and diffs want."""
    if sys.stdout.isatty():
        out().print(renderable)
        return
    console = Console(file=io.StringIO(), markup=False, highlight=False, emoji=False,
                      width=4096, color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    for line in cap.get().splitlines():
        click.echo(line.rstrip())


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                title: str | None = None) -> None:
    t = make_table(headers, title)
    for r in rows:
        t.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in r))
    emit(t)


def print_fields(rows: Sequence[tuple[str, object]]) -> None:
    """``name  value`` lines with the names aligned."""
    t = Table(box=None, pad_edge=False, show_header=False, show_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        t.add_row(Text(k), v if isinstance(v, Text) else Text(str(v)))
    emit(t)


def _blocks() -> tuple[str, str]:
    enc = (getattr(sys.stdout, "encoding", None) or "ascii").lower()
    return ("█", "░") if "utf" in enc else ("#", ".")


def usage_bar(used: float, capacity: float, width: int = 24) -> Text:
    """``████░░░░ 42%``: green below 70 %, yellow below 90 %, then red."""
    full, empty = _blocks()
    frac = min(max(used / capacity, 0.0), 1.0) if capacity > 0 else 0.0
    n = round(frac * width)
    style = "green" if frac < 0.7 else "yellow" if frac < 0.9 else "red"
    t = Text()
    t.append(full * n, style=style)
    t.append(empty * (width - n), style="dim")
    t.append(f" {frac * 100:.0f}%")
    return t


class Reporter(Protocol):
    def __call__(self, done: float, total: float | None = None,
                 rate: float | None = None) -> None: ...


def _no_report(done: float, total: float | None = None, rate: float | None = None) -> None:
    pass


@contextmanager
def progress(description: str, quiet: bool = False) -> Iterator[Reporter]:
    """A progress bar with bytes, throughput and ETA on stderr -- only on a terminal and
    not with ``--json`` (``quiet``): a pipe or a log gets no control characters.  Yields
    ``report(done, total, rate)``; ``rate`` is the daemon's bytes/s over the whole job
    (steadier than a client-side estimate from a few polls), the ETA follows from it."""
    if quiet or not sys.stderr.isatty():
        yield _no_report
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  DownloadColumn(binary_units=True), TextColumn("{task.fields[rate]}"),
                  TextColumn("{task.fields[eta]}"), console=err_console()) as bar:
        task = bar.add_task(description, total=None, rate="", eta="")

        def report(done: float, total: float | None = None,
                   rate: float | None = None) -> None:
            eta = ""
            if rate and total:
                eta = "ETA " + human_duration(max(0.0, total - done) / rate)
            bar.update(task, completed=done, total=total or None, eta=eta,
                       rate=f"{human_bytes(rate)}/s" if rate else "")

        yield report


def getenv_debug() -> bool:
    return os.environ.get("TIERCTL_DEBUG", "") not in ("", "0")
