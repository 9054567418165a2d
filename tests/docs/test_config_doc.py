"""docs/config.md's settings table is exactly what ``python -m tierd.config_doc`` renders.

A setting added to tierd/config.py without regenerating the doc fails here, and the failure
names the command that fixes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tierd import config_doc
from tierd.config import SETTINGS
from tierd.config_doc import BEGIN, COMMAND, DOC_PATH, END, render_doc, render_table

ROOT = Path(__file__).resolve().parents[2]


def test_config_md_is_generated_from_the_settings_table() -> None:
    assert DOC_PATH == ROOT / "docs" / "config.md"
    current = DOC_PATH.read_text()
    assert current == render_doc(current), (
        f"docs/config.md is out of date with tierd/config.py: run `{COMMAND}` and commit it"
    )


def test_table_has_one_row_per_setting_with_env_and_flag() -> None:
    rows = [line for line in render_table().splitlines()[2:]]
    assert len(rows) == len(SETTINGS)
    for row, spec in zip(rows, SETTINGS, strict=True):
        assert row.startswith(f"| `{spec.name}` | `{spec.env}` |")
        assert f"`{spec.flag} " in row
    table = render_table()
    assert "| `s3_listen` | `TIERD_S3_LISTEN` | `127.0.0.1:9000` |" in table
    assert "| `hot_dir` | `TIERD_HOT_DIR` | `DATA_DIR/hot` |" in table
    assert "| `dirty_limit` | `TIERD_DIRTY_LIMIT` | `1GiB` |" in table
    assert "| `umask` | `TIERD_UMASK` | `022` |" in table
    assert "`--log-format text\\|json`" in table  # a | inside a cell is escaped


def test_render_keeps_the_prose_and_replaces_only_between_markers() -> None:
    doc = f"# intro\n\nprose before\n\n{BEGIN}\nstale table\n{END}\n\nprose after\n"
    out = render_doc(doc)
    assert out.startswith("# intro\n\nprose before\n\n" + BEGIN)
    assert out.endswith(END + "\n\nprose after\n")
    assert "stale table" not in out
    assert render_doc(out) == out


def test_check_command_fails_on_a_stale_doc_and_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "config.md"
    stale.write_text(f"# Configuring tierd\n\n{BEGIN}\n| key |\n{END}\n")
    monkeypatch.setattr(config_doc, "DOC_PATH", stale)
    assert config_doc.main(["--check"]) == 1
    assert f"run `{COMMAND}`" in capsys.readouterr().err
    assert config_doc.main([]) == 0
    assert config_doc.main(["--check"]) == 0
    assert "`TIERD_DATA_DIR`" in stale.read_text()
    assert config_doc.main(["--bogus"]) == 2


def test_module_runs_as_a_command_and_the_repo_doc_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tierd.config_doc", "--check"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
