"""torch.save / torch.load through the mount, with the write-temp-then-rename pattern."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

_SAVE = """
import os, sys, torch
d = sys.argv[1]
torch.manual_seed(0)
sd = {"w": torch.randn(512, 256), "b": torch.arange(100), "step": 12}
tmp = os.path.join(d, "ckpt.pt.tmp")
torch.save(sd, tmp)
with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
os.replace(tmp, os.path.join(d, "ckpt.pt"))
got = torch.load(os.path.join(d, "ckpt.pt"))
assert torch.equal(got["w"], sd["w"]) and torch.equal(got["b"], sd["b"]) and got["step"] == 12
print(sorted(os.listdir(d)))
"""


def test_torch_save_temp_then_rename(work: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _SAVE, str(work)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['ckpt.pt']"
    check = subprocess.run([sys.executable, "-c", "import sys, torch; sd = torch.load("
                            "sys.argv[1]); print(sd['step'], tuple(sd['w'].shape))",
                            str(work / "ckpt.pt")], capture_output=True, text=True, timeout=120)
    assert check.stdout.strip() == "12 (512, 256)", check.stderr
