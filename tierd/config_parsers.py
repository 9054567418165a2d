"""The machinery behind tierd's settings table: value parsers and the ``setting()`` field
metadata.  Split from :mod:`tierd.config` so that module stays the readable table itself;
every parser takes the raw value (TOML, environment or flag) and a :class:`ParseContext`
naming where it came from, so errors name the key and the source.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:
    from tierd.config import Config

T = TypeVar("T")


class ConfigError(Exception):
    """A setting could not be accepted.  ``str(err)`` names the key and the source."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None):
        super().__init__(message)
        self.key = key
        self.source = source


class ParseContext(NamedTuple):
    """What a parser needs to know about where a value came from."""

    #: relative paths are taken relative to this directory (the config file's directory for
    #: values from the file, the current directory otherwise)
    base_dir: Path


Parser = Callable[[object, ParseContext], T]


@dataclass(frozen=True)
class SettingInfo(Generic[T]):
    """The table entry of one setting (stored in the dataclass field's metadata)."""

    parse: Parser[T]
    help: str
    #: for settings whose default depends on other settings (``hot_dir`` under ``data_dir``)
    derive: Callable[[Config], T] | None = None
    #: never echo the value in error messages (credentials)
    secret: bool = False
    #: placeholder shown in ``--help``
    metavar: str = "VALUE"


_META_KEY = "tierd.setting"


def setting(
    *,
    parse: Parser[T],
    help: str,
    derive: Callable[[Config], T] | None = None,
    secret: bool = False,
    metavar: str = "VALUE",
) -> dict[str, SettingInfo[T]]:
    """The table entry of one setting, as ``field(..., metadata=setting(...))``.

    A setting with ``derive`` is declared ``field(default=DERIVED, ...)``: its default is
    computed from the other settings after loading (see :meth:`Config.__post_init__`).
    """
    return {
        _META_KEY: SettingInfo(
            parse=parse, help=help, derive=derive, secret=secret, metavar=metavar
        )
    }


#: Default of derived settings: a value no parser can produce (paths cannot contain NUL),
#: meaning "compute me from the other settings".
DERIVED: Any = Path("\x00derived")


# --- parsers --------------------------------------------------------------------------------
# Each takes the raw value (a native TOML value, or a string from the environment or the
# command line) and returns the typed value or raises ValueError with a human message.


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array"}
    return names.get(type(value), "table" if isinstance(value, dict) else type(value).__name__)


def _need_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected {what} (a string), got {_type_name(value)}")
    return value


def parse_str(value: object, ctx: ParseContext) -> str:
    """Any non-empty string."""
    s = _need_str(value, "a string")
    if not s:
        raise ValueError("must not be empty")
    return s


def parse_path(value: object, ctx: ParseContext) -> Path:
    """A filesystem path; ``~`` is expanded and relative paths are made absolute."""
    s = _need_str(value, "a path")
    if not s:
        raise ValueError("must not be empty")
    if "\x00" in s:
        raise ValueError("must not contain NUL")
    p = Path(s).expanduser()
    if not p.is_absolute():
        p = ctx.base_dir / p
    return Path(os.path.normpath(p))


def parse_optional_path(value: object, ctx: ParseContext) -> Path | None:
    """A path, or the empty string for "none"."""
    if value == "":
        return None
    return parse_path(value, ctx)


class HostPort(NamedTuple):
    """A listen address.  ``str()`` gives ``HOST:PORT`` (``[v6]:PORT`` for IPv6)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_HOSTNAME = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")


def parse_host_port(value: object, ctx: ParseContext) -> HostPort:
    """``HOST:PORT`` with an IPv4 address, a host name or a bracketed IPv6 address;
    port 0 asks the kernel for a free port."""
    s = _need_str(value, "HOST:PORT").strip()
    example = "expected HOST:PORT, e.g. 127.0.0.1:9000 or [::1]:9000"
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or s[end + 1 : end + 2] != ":":
            raise ValueError(example)
        host, port_s = s[1:end], s[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port_s = s.rpartition(":")
        if not sep or not host:
            raise ValueError(example)
        if ":" in host:
            raise ValueError(f"{example} (put an IPv6 address in brackets)")
        if not _HOSTNAME.match(host):
            raise ValueError(f"{host!r} is not a valid host name or address")
    if not port_s.isdigit():
        raise ValueError(f"port {port_s!r} is not a number ({example})")
    port = int(port_s)
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0-65535")
    return HostPort(host, port)


def parse_choice(*choices: str) -> Parser[str]:
    """One of ``choices`` (case-insensitive; stored lower-case)."""

    def parse(value: object, ctx: ParseContext) -> str:
        s = _need_str(value, "one of " + ", ".join(choices)).strip().lower()
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return s

    return parse


def parse_umask(value: object, ctx: ParseContext) -> int:
    """An octal file-creation mask: ``"022"``, ``"0o022"`` or a TOML integer like ``0o022``."""
    if isinstance(value, bool):
        raise ValueError('expected an octal umask such as "022", got boolean')
    if isinstance(value, int):
        n = value
    else:
        s = _need_str(value, 'an octal umask such as "022"').strip().lower()
        s = s.removeprefix("0o")
        if not s or any(c not in "01234567" for c in s):
            raise ValueError(f'{value!r} is not an octal umask such as "022"')
        n = int(s, 8)
    if not 0 <= n <= 0o777:
        raise ValueError(f"umask {n:#o} is out of range 000-777")
    return n


def parse_int(lo: int, hi: int | None = None) -> Parser[int]:
    """An integer in ``[lo, hi]`` (strings of decimal digits accepted from env and CLI)."""

    def parse(value: object, ctx: ParseContext) -> int:
        if isinstance(value, bool):
            raise ValueError("expected an integer, got boolean")
        if isinstance(value, int):
            n = value
        else:
            s = _need_str(value, "an integer").strip()
            try:
                n = int(s, 10)
            except ValueError:
                raise ValueError(f"{s!r} is not an integer") from None
        if n < lo or (hi is not None and n > hi):
            raise ValueError(f"{n} is out of range {lo}-{'' if hi is None else hi}")
        return n

    return parse


def parse_float(lo: float, hi: float) -> Parser[float]:
    """A number in ``[lo, hi]`` (decimal strings accepted from env and CLI)."""

    def parse(value: object, ctx: ParseContext) -> float:
        if isinstance(value, bool):
            raise ValueError("expected a number, got boolean")
        if isinstance(value, (int, float)):
            x = float(value)
        else:
            s = _need_str(value, "a number").strip()
            try:
                x = float(s)
            except ValueError:
                raise ValueError(f"{s!r} is not a number") from None
        if not lo <= x <= hi:  # (also rejects nan)
            raise ValueError(f"{x:g} is out of range {lo:g}-{hi:g}")
        return x

    return parse


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(value: object, ctx: ParseContext) -> bool:
    """A boolean; from env and CLI: 1/0, true/false, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    s = _need_str(value, "a boolean").strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean (use true or false)")


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(value: object, ctx: ParseContext) -> int:
    """A byte count: an integer, or ``"64GiB"``/``"512M"`` (binary units: 1K = 1024)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError("a size must not be negative")
        return value
    s = _need_str(value, 'a size such as "64GiB"')
    m = _SIZE.match(s)
    if not m:
        raise ValueError(f'{s!r} is not a size such as "512MiB" or "64G"')
    return int(m.group(1)) << (10 * " kmgtp".index(m.group(2).lower() or " "))


_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def parse_region(value: object, ctx: ParseContext) -> str:
    s = _need_str(value, "a region name").strip()
    if not _REGION.match(s):
        raise ValueError(f"{s!r} is not a region name such as us-east-1")
    return s


def parse_domains(value: object, ctx: ParseContext) -> tuple[str, ...]:
    """Comma-separated host names (a TOML array of strings is accepted too); empty: none."""
    items: list[object]
    if isinstance(value, list):
        items = list(value)
    else:
        items = list(_need_str(value, "domain names").split(","))
    out: list[str] = []
    for item in items:
        d = _need_str(item, "a domain name").strip().lower().strip(".")
        if not d:
            continue
        if not _HOSTNAME.match(d):
            raise ValueError(f"{d!r} is not a valid domain name")
        out.append(d)
    return tuple(out)


def parse_optional_str(value: object, ctx: ParseContext) -> str:
    """Any string; empty means "not set" (credentials, endpoints left to their defaults)."""
    return _need_str(value, "a string").strip()


def parse_optional_region(value: object, ctx: ParseContext) -> str:
    """A region name, or empty for the client library's own default."""
    s = _need_str(value, "a region name").strip()
    return parse_region(s, ctx) if s else ""


_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def parse_cold_url(value: object, ctx: ParseContext) -> str:
    """The cold store: ``file:///DIR`` (or a plain directory path), ``s3://BUCKET/PREFIX``,
    ``s3://`` (one S3 bucket per tierd bucket) or another fsspec URL (``memory://x``)."""
    s = _need_str(value, "a URL such as s3://bucket/prefix or file:///dir").strip()
    if not s:
        raise ValueError("must not be empty")
    if "://" not in s:
        return "file://" + str(parse_path(s, ctx))
    scheme, rest = s.split("://", 1)
    scheme = scheme.lower()
    if not re.match(r"^[a-z][a-z0-9+.-]*$", scheme):
        raise ValueError(f"{scheme!r} is not a URL scheme")
    if scheme == "file":
        if not rest:
            raise ValueError("file:// URL names no directory")
        return "file://" + str(parse_path(rest, ctx))
    if scheme in ("s3", "s3a"):
        bucket = rest.split("/", 1)[0]
        if bucket and not _S3_BUCKET.match(bucket):
            raise ValueError(f"{bucket!r} is not a valid S3 bucket name")
        return f"{scheme}://{rest}"
    # anything else is opened with fsspec: an unknown protocol fails here, not at start-up
    from fsspec.registry import known_implementations, registry

    if scheme not in registry and scheme not in known_implementations:
        raise ValueError(f"unknown cold store protocol {scheme!r}: use file:///DIR, "
                         "s3://BUCKET/PREFIX or a protocol fsspec knows (memory://, gcs://, "
                         "...)")
    return f"{scheme}://{rest}"


def parse_http_url(value: object, ctx: ParseContext) -> str:
    """``http(s)://HOST[:PORT]``, or empty for the service's default endpoint."""
    s = _need_str(value, "a URL such as http://127.0.0.1:9000").strip()
    if s and not re.match(r"^https?://[^/\s]+(/.*)?$", s):
        raise ValueError(f"{s!r} is not an http:// or https:// URL")
    return s.rstrip("/")
