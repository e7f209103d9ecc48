"""The developer lesson's two scripts, run exactly as a learner runs them: `torchrun --nproc_per_node=2`
from a fresh folder, and the printed lines compared with the reference lesson's numbers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

TORCHRUN = Path(sys.executable).parent / "torchrun"
SCRIPTS = ROOT / "solutions" / "developer"


def torchrun(script: str, cwd: Path) -> list[str]:
    """Run one script with ``torchrun --standalone --nproc_per_node=2`` in ``cwd``.

    Each rank's stdout goes to its own file (``--redirects 1``): two processes printing to one
    pipe can interleave mid-line. Returns rank 0's lines, then rank 1's.
    """
    logs = cwd / "torchrun-logs"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "--log-dir", str(logs),
                           "--redirects", "1", script],
                          cwd=cwd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = []
    for rank in range(2):
        (log,) = logs.glob(f"*/attempt_0/{rank}/stdout.log")
        lines += log.read_text().splitlines()
    shutil.rmtree(logs)
    return lines


@pytest.fixture
def workdir(tmp_path):
    for name in ("ddp_save_log.py", "ddp_resume.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    return tmp_path


def test_the_scripts_are_released_beside_the_notebooks():
    for name in ("ddp_save_log.py", "ddp_resume.py"):
        assert (ROOT / "notebooks" / "developer" / name).read_bytes() == (SCRIPTS / name).read_bytes()


def test_save_log_then_resume_print_the_reference_numbers(workdir):
    assert torchrun("ddp_save_log.py", workdir) == [
        "rank 0: my loss 0.5934 | true loss over all 12 samples 1.3542",
        "rank 0: loaded keys ['weight', 'bias']",
        "rank 1: my loss 2.1151 | true loss over all 12 samples 1.3542",
        "rank 1: loaded keys ['weight', 'bias']",
    ]
    assert sorted(p.name for p in workdir.iterdir() if p.suffix == ".pt") == ["ckpt.pt"]
    assert torchrun("ddp_resume.py", workdir) == [
        "rank 0: resuming from step 1, weight checksum -0.381006",
        "rank 1: resuming from step 1, weight checksum -0.381006",
    ]


def test_resume_without_a_checkpoint_starts_at_step_0(workdir):
    assert torchrun("ddp_resume.py", workdir) == [
        "rank 0: resuming from step 0, weight checksum -0.515014",
        "rank 1: resuming from step 0, weight checksum -0.515014",
    ]
