"""Start-up cost of a pool: helpers.spawn against torch's `spawn` and a raw fork, measured in one run.

Each launch starts N ranks, joins them into a gloo group, does one all_reduce and tears
everything down. Medians of several warm launches (the first launch of each method, which
pays one-off imports, is not counted). Targets (issues 2 and 14): helpers.spawn at least 30x
faster than spawn, and within 1.3x of a raw fork from a clean parent, at 4 ranks.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

WORLD_SIZES = (2, 4, 8)


def _all_reduce_once() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _spawned_rank(rank: int, world_size: int, port: int) -> None:
    """Entry point for torch.multiprocessing's spawn: a fresh interpreter imports torch."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    import torch.distributed as dist

    dist.init_process_group("gloo")
    _all_reduce_once()
    dist.destroy_process_group()


def time_helpers_spawn(world_size: int, repeats: int) -> list[float]:
    from helpers.spawn import run

    run(_all_reduce_once, world_size=world_size, echo=False)  # warm: the fork server starts
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        assert run(_all_reduce_once, world_size=world_size, echo=False) == [world_size] * world_size
        times.append(time.perf_counter() - t0)
    return times


def time_torch_spawn(world_size: int, repeats: int) -> list[float]:
    import torch.distributed as dist
    import torch.multiprocessing as tmp

    times = []
    for _ in range(repeats):
        store = dist.TCPStore("127.0.0.1", 0, world_size, True, wait_for_workers=False)
        t0 = time.perf_counter()
        tmp.start_processes(_spawned_rank, args=(world_size, store.port), nprocs=world_size,
                            start_method="spawn", join=True)
        times.append(time.perf_counter() - t0)
        del store
    return times


_RAW_FORK = r"""
import os, sys, tempfile, time
import torch, torch.distributed as dist   # imported, never used: a clean parent
world_size, repeats = int(sys.argv[1]), int(sys.argv[2])
def launch():
    # A FileStore: the parent must hold no threads when it forks (a TCPStore server's
    # thread can hold a lock at fork time and deadlock the child).
    path = tempfile.mktemp(prefix="rawfork-store-")
    pids = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(1)
            store = dist.FileStore(path, world_size)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
            t = torch.ones(1); dist.all_reduce(t)
            dist.destroy_process_group()
            os._exit(0 if t.item() == world_size else 1)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert status == 0
    if os.path.exists(path):
        os.unlink(path)
launch()  # warm
for _ in range(repeats):
    t0 = time.perf_counter(); launch(); print(time.perf_counter() - t0, flush=True)
"""


def time_raw_fork(world_size: int, repeats: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", _RAW_FORK, str(world_size), str(repeats)],
                         capture_output=True, text=True, check=True, timeout=600)
    return [float(x) for x in out.stdout.split()]


def main(repeats: int = 7, spawn_repeats: int = 3) -> bool:
    print(__doc__.strip().splitlines()[0])
    print(f"{'ranks':>5} {'helpers.spawn':>14} {'torch spawn':>12} {'raw fork':>9} "
          f"{'spawn/ours':>11} {'ours/fork':>10}")
    ok = True
    for ws in WORLD_SIZES:
        ours = statistics.median(time_helpers_spawn(ws, repeats))
        spawn = statistics.median(time_torch_spawn(ws, spawn_repeats))
        fork = statistics.median(time_raw_fork(ws, repeats))
        speedup, overhead = spawn / ours, ours / fork
        print(f"{ws:>5} {ours:>13.3f}s {spawn:>11.2f}s {fork:>8.3f}s {speedup:>10.0f}x {overhead:>9.2f}x",
              flush=True)
        if ws == 4:
            ok = speedup >= 30 and overhead <= 1.3
            target = (f"targets at 4 ranks: >= 30x faster than spawn ({speedup:.0f}x), "
                      f"<= 1.3x raw fork ({overhead:.2f}x)")
    print(("MET: " if ok else "MISSED: ") + target)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
