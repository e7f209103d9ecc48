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


def torchrun(script: str, cwd: Path, *args: str) -> list[str]:
    """Run one script with ``torchrun --standalone --nproc_per_node=2`` in ``cwd``.

    Each rank's stdout goes to its own file (``--redirects 1``): two processes printing to one
    pipe can interleave mid-line. Returns rank 0's lines, then rank 1's.
    """
    logs = cwd / "torchrun-logs"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "--log-dir", str(logs),
                           "--redirects", "1", script, *args],
                          cwd=cwd, capture_output=True, text=True, timeout=180, env=env)
    printed = "".join(f"\nrank {log.parent.name} printed:\n{log.read_text()}"
                      for log in sorted(logs.glob("*/attempt_*/*/stdout.log")))
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}{printed}"
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


def test_backend_gloo_explicit_prints_the_same_lines(workdir):
    """`--backend gloo` is the default on a machine without CUDA: same lines as without the flag."""
    assert torchrun("ddp_save_log.py", workdir, "--backend", "gloo")[:2] == [
        "rank 0: my loss 0.5934 | true loss over all 12 samples 1.3542",
        "rank 0: loaded keys ['weight', 'bias']",
    ]


def test_backend_nccl_without_a_gpu_is_refused_with_advice(workdir):
    import torch

    if torch.cuda.is_available():  # pragma: no cover - the course's machines have no GPU
        pytest.skip("a GPU is visible: nccl is a valid choice here")
    env = dict(os.environ, LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "ddp_save_log.py", "--backend", "nccl"], cwd=workdir,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "--backend nccl needs CUDA GPUs, and none is visible: use --backend gloo" in proc.stderr


# ----------------------------------------------------------------------------- two nodes


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sessions_alive(sids: set[int]) -> list[int]:
    """PIDs of every live process whose session is one of ``sids`` (an agent and its workers)."""
    import psutil

    alive = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) in sids and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def two_agents(script: str, cwd: Path, timeout: float = 240) -> dict[int, list[str]]:
    """Start two torchrun agents, as two nodes of 2 processes each, with c10d rendezvous on 127.0.0.1.

    Both run in ``cwd`` (a shared filesystem, as a cluster's home or project folder is). Each
    agent and its workers form their own session, killed at the end whatever happened. Returns
    each global rank's printed lines (read from the agents' per-rank log files).
    """
    import signal
    import time

    port = _free_port()
    logs = cwd / f"torchrun-logs-{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    agents = []
    try:
        for node in range(2):
            cmd = [str(TORCHRUN), "--nnodes=2", "--nproc_per_node=2", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=course-two-nodes",
                   "--log-dir", str(logs / f"node{node}"), "--redirects", "1", script]
            agents.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, start_new_session=True))
        deadline = time.monotonic() + timeout
        outputs = [a.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for a in agents]
        for a, out in zip(agents, outputs):
            assert a.returncode == 0, f"an agent failed ({a.returncode}):\n{out}"
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()
            try:
                os.killpg(a.pid, signal.SIGKILL)  # workers the agent may have left behind
            except ProcessLookupError:
                pass
    assert _sessions_alive({a.pid for a in agents}) == [], "a torchrun agent or worker was left behind"
    printed: dict[int, list[str]] = {}
    for log in logs.glob("node*/*/attempt_0/*/stdout.log"):
        for line in log.read_text().splitlines():
            rank = int(line.split(":", 1)[0].removeprefix("rank "))
            printed.setdefault(rank, []).append(line)
    shutil.rmtree(logs)
    return printed


def test_two_torchrun_agents_as_two_nodes_agree_on_the_loss_over_all_24_samples(workdir):
    """The scripts run unchanged as 2 nodes x 2 processes: 4 ranks of 6 samples each, one combined loss."""
    printed = two_agents("ddp_save_log.py", workdir)
    assert sorted(printed) == [0, 1, 2, 3], printed
    combined = set()
    for rank, lines in printed.items():
        assert len(lines) == 2 and lines[1] == f"rank {rank}: loaded keys ['weight', 'bias']", lines
        head, _, total = lines[0].partition(" | ")
        assert total.startswith("true loss over all 24 samples "), lines[0]
        combined.add(total)
    assert len(combined) == 1, f"the ranks disagree on the combined loss: {combined}"
    # the first two ranks hold the 2-rank lesson's data: their own losses are unchanged
    assert printed[0][0].startswith("rank 0: my loss 0.5934 |")
    assert printed[1][0].startswith("rank 1: my loss 2.1151 |")
    assert sorted(p.name for p in workdir.iterdir() if p.suffix == ".pt") == ["ckpt.pt"]
    resumed = two_agents("ddp_resume.py", workdir)
    checksums = {lines[0].split("checksum ")[1] for lines in resumed.values()}
    assert sorted(resumed) == [0, 1, 2, 3] and len(checksums) == 1, resumed
    assert all(lines[0].startswith(f"rank {r}: resuming from step 1,") for r, lines in resumed.items())
