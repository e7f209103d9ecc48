"""helpers.spawn.run from real Jupyter kernels: cell-defined functions after the kernel used
torch's thread pool, output in the cell, interrupt, and a kernel that dies mid-run."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import sys

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.notebook


@pytest.fixture
def kernel(tmp_path, request):
    # The kernel's temp files (and its fork server's) go into tmp_path: a test that kills
    # them leaves nothing in the run's temp folder.
    env = {**os.environ, "TMPDIR": str(tmp_path), **getattr(request, "param", {})}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
        km.cleanup_resources()  # the connection file, also when a test killed the kernel


def execute(kc, code: str, timeout: float = 240) -> tuple[list[str], list[dict]]:
    """Run code in the kernel; return (stream texts, error contents)."""
    msg_id = kc.execute(textwrap.dedent(code))
    streams, errors = [], []
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            streams.append(content["text"])
        elif kind == "error":
            errors.append(content)
        elif kind == "status" and content["execution_state"] == "idle":
            return streams, errors


def wait_for_files(paths: list[Path], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, f"ranks never started: {paths}"
        time.sleep(0.05)  # polling for a condition, not ordering anything


HANGING_POOL = """
import os, torch.distributed as dist
from helpers.spawn import run
def hang_after_pid(folder):
    with open(os.path.join(folder, f"rank{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if dist.get_rank() == 0:
        dist.barrier()
run(hang_after_pid, FOLDER, world_size=2, timeout=600)
"""


def test_cell_defined_functions_work_after_the_kernel_used_threads(kernel):
    _, kc = kernel
    _, errors = execute(kc, """
        import torch
        torch.set_num_threads(2)
        a = torch.randn(800, 800); (a @ a).sum()   # the kernel's OpenMP pool is now running
    """)
    assert not errors
    streams, errors = execute(kc, """
        import torch.distributed as dist
        from helpers.spawn import run
        scale = 3
        def matmul_in_rank():
            b = torch.randn(800, 800)
            print("threads", torch.get_num_threads())
            return float((b @ b).shape[0]) * scale + dist.get_rank()
        out = run(matmul_in_rank, world_size=2, threads=2, timeout=120)
        lam = run(lambda: dist.get_world_size(), world_size=3, timeout=120)
        print("RESULT", out, lam)
    """)
    assert not errors, errors
    text = "".join(streams)
    assert "RESULT [2400.0, 2401.0] [3, 3, 3]" in text
    assert "[rank 0] threads 2" in text and "[rank 1] threads 2" in text


def test_kernel_interrupt_raises_keyboardinterrupt_and_kills_the_pool(kernel, tmp_path):
    km, kc = kernel
    pids = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    msg_id = kc.execute(HANGING_POOL.replace("FOLDER", repr(str(tmp_path))))
    wait_for_files(pids)
    procs = [psutil.Process(int(p.read_text())) for p in pids]
    km.interrupt_kernel()
    errors = []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            errors.append(msg["content"]["ename"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert errors == ["KeyboardInterrupt"]
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive
    streams, errs = execute(kc, """
        from helpers.spawn import live_ranks
        print("AFTER", run(lambda: 1, world_size=2, echo=False), live_ranks())
    """)
    assert not errs and "AFTER [1, 1] []" in "".join(streams)


def test_no_rank_survives_the_kernel_dying(kernel, tmp_path):
    km, kc = kernel
    pids = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    kc.execute(HANGING_POOL.replace("FOLDER", repr(str(tmp_path))))
    wait_for_files(pids)
    kernel_proc = psutil.Process(km.provisioner.process.pid)
    family = [p for p in kernel_proc.children(recursive=True)]
    ranks = [psutil.Process(int(p.read_text())) for p in pids]
    assert {r.pid for r in ranks} <= {p.pid for p in family}
    kernel_proc.kill()  # the kernel dies: no cleanup code of ours runs in it
    gone, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"


DEATH_SIGNAL_OF_RANKS = """
import ctypes, os, torch.distributed as dist
from helpers.spawn import run
def report_then_hang(folder):
    sig = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    with open(os.path.join(folder, f"rank{dist.get_rank()}.pid"), "w") as f:
        f.write(f"{os.getpid()} {sig.value}")
    if dist.get_rank() == 0:
        dist.barrier()
run(report_then_hang, FOLDER, world_size=2, timeout=600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_GET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("kernel", [{"HELPERS_SPAWN_NO_PDEATHSIG": "1"}], indirect=True)
def test_the_watchdog_alone_ends_ranks_whose_kernel_and_server_were_killed(kernel, tmp_path):
    """As on macOS (no parent-death signal): the kernel and the fork server are SIGKILLed
    while rank 0 waits in a barrier; each rank's watchdog sees its control pipe close."""
    km, kc = kernel
    pids = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    kc.execute(DEATH_SIGNAL_OF_RANKS.replace("FOLDER", repr(str(tmp_path))))
    wait_for_files(pids)
    reports = [p.read_text().split() for p in pids]
    assert [sig for _, sig in reports] == ["0", "0"], "the parent-death signal was armed"
    ranks = [psutil.Process(int(pid)) for pid, _ in reports]
    kernel_proc = psutil.Process(km.provisioner.process.pid)
    servers = [p for p in kernel_proc.children() if "helpers._pool.server" in " ".join(p.cmdline())]
    assert len(servers) == 1
    for p in [kernel_proc] + servers:
        p.kill()
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"
