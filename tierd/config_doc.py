"""Render the settings reference in ``docs/config.md`` from the settings table.

The table in :mod:`tierd.config` (the :class:`~tierd.config.Config` dataclass and its
``setting(...)`` metadata) is the one source of truth for keys, environment variables, flags,
defaults and help texts.  A hand-written copy drifts the day someone adds a setting, so the
reference table between the markers below is generated, and ``tests/docs/test_config_doc.py``
fails when the file is not what this module produces.  The prose around the markers stays
hand-written.

Usage::

    python -m tierd.config_doc            # rewrite docs/config.md in place
    python -m tierd.config_doc --check    # exit 1 if docs/config.md is out of date
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from tierd.config import SETTINGS, Config, HostPort, Setting
from tierd.config_parsers import DERIVED, parse_bool, parse_size, parse_umask

BEGIN = "<!-- BEGIN GENERATED -->"
END = "<!-- END GENERATED -->"
COMMAND = "python -m tierd.config_doc"
DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "config.md"

#: Defaults that depend on the machine (user, XDG variables), shown as a rule instead.
_DEFAULT_OVERRIDES = {
    "data_dir": "the user's data directory: `~/.local/share/tierd` "
    "(`$XDG_DATA_HOME/tierd` when set)",
}
#: Placeholder the derived defaults are computed against, so they read ``DATA_DIR/hot``.
_PLACEHOLDER_DATA_DIR = Path("DATA_DIR")
_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _cell(text: str) -> str:
    """Escape a value for a markdown table cell (a ``|`` would end the cell)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _size(n: int) -> str:
    for unit, name in _UNITS:
        if n and n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def _format_default(spec: Setting, value: object) -> str:
    """The default as a user would write it in the TOML file, in backticks; empty: a word."""
    parse = spec.info.parse
    if value is None or value == "" or value == ():
        return "empty"
    if parse is parse_size and isinstance(value, int):
        text = _size(value)
    elif parse is parse_umask and isinstance(value, int):
        text = f"{value:03o}"
    elif parse is parse_bool and isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, Path | HostPort):  # HostPort is a tuple: test it first
        text = str(value)
    elif isinstance(value, tuple):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    return f"`{text}`"


def _defaults() -> dict[str, str]:
    """Each setting's default, derived ones computed relative to ``DATA_DIR``."""
    derived = Config(data_dir=_PLACEHOLDER_DATA_DIR)
    fields = {f.name: f for f in dataclasses.fields(Config)}
    out: dict[str, str] = {}
    for spec in SETTINGS:
        if spec.name in _DEFAULT_OVERRIDES:
            out[spec.name] = _DEFAULT_OVERRIDES[spec.name]
            continue
        f = fields[spec.name]
        if f.default is DERIVED:
            text = _format_default(spec, getattr(derived, spec.name))
            # cold_url derives from cold_dir: say so rather than show a resolved path
            out[spec.name] = text.replace("file://DATA_DIR/cold", "file://COLD_DIR")
        elif f.default is not dataclasses.MISSING:
            out[spec.name] = _format_default(spec, f.default)
        else:  # a default_factory not overridden above: show what it gives here
            out[spec.name] = _format_default(spec, getattr(Config(), spec.name))
    return out


def render_table() -> str:
    """The reference table, one row per setting, in the order of the dataclass."""
    defaults = _defaults()
    lines = [
        "| key | env var | default | flag | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for spec in SETTINGS:
        flag = f"`{spec.flag} {spec.info.metavar}`"
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{spec.name}`",
                    f"`{spec.env}`",
                    _cell(defaults[spec.name]),
                    _cell(flag),
                    _cell(spec.info.help + (" Never logged or shown." if spec.info.secret
                                            else "")),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def render_doc(text: str) -> str:
    """``text`` with the part between the markers replaced by the generated table."""
    start = text.find(BEGIN)
    end = text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/config.md lacks the markers {BEGIN} ... {END}")
    note = (
        f"<!-- Generated from tierd/config.py by `{COMMAND}`; do not edit by hand. -->"
    )
    body = f"{BEGIN}\n{note}\n\n{render_table()}\n\n"
    return text[:start] + body + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite docs/config.md (or, with ``--check``, report whether it is current)."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    unknown = [a for a in args if a != "--check"]
    if unknown:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    current = DOC_PATH.read_text()
    wanted = render_doc(current)
    if check:
        if current != wanted:
            print(f"docs/config.md is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        DOC_PATH.write_text(wanted)
        print(f"rewrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
