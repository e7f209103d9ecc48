"""helpers.lessons.logs, the plumbing of the three logging lessons, on real ranks, real torchrun and a
real TensorBoard server; and the claims the developer lesson makes about the dashboard, checked against
the dashboard itself (`tensorboard --logdir`, its HTTP API), since the notebook only reads event files."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
import torch.distributed as dist

from helpers.lessons import logs
from helpers.spawn import run


# ----------------------------------------------------------------------------- what a cell shows


def _talk(steps):
    import sys as _sys

    from tqdm import tqdm

    rank = dist.get_rank()
    for step in range(steps):
        print(f"step {step} from rank {rank}")
    for _ in tqdm(range(3), desc=f"bar{rank}", file=_sys.stderr):
        pass
    return rank * 10


def test_run_and_capture_returns_values_and_every_rank_line(capsys):
    values, lines = logs.run_and_capture(_talk, 2, world_size=3)
    assert values == [0, 10, 20]
    for rank in range(3):
        mine = [line for line in lines if logs.rank_of(line) == rank]
        assert [line for line in mine if "step" in line] == [f"[rank {rank}] step {s} from rank {rank}"
                                                               for s in range(2)]
        (bar,) = [line for line in mine if "bar" in line]  # carriage returns stay inside the line
        assert "\r" in bar and "3/3" in logs.on_screen(bar)
    shown = capsys.readouterr()
    assert "[rank 2] step 1 from rank 2" in shown.out and "bar1" in shown.err


def test_run_and_capture_can_keep_the_cell_quiet(capsys):
    values, lines = logs.run_and_capture(_talk, 1, world_size=2, show=False)
    assert values == [0, 10] and len([line for line in lines if "step" in line]) == 2
    shown = capsys.readouterr()
    assert shown.out == "" and shown.err == ""


def test_on_screen_and_rank_of():
    assert logs.on_screen("[rank 1] \r  0%| 0/3\r100%| 3/3\r") == "100%| 3/3"
    assert logs.on_screen("plain line") == "plain line" and logs.on_screen("\r\r") == ""
    assert logs.rank_of("[rank 12] hello") == 12 and logs.rank_of("hello [rank 1]") is None


# ----------------------------------------------------------------------------- torchrun


SCRIPT = """
import sys
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"out of rank {dist.get_rank()}")
print(f"err of rank {dist.get_rank()}", file=sys.stderr)
dist.destroy_process_group()
"""


def test_rank_logs_reads_what_torchrun_wrote_per_rank(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    log_dir = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--log-dir", str(log_dir), "--tee", "3", "--local-ranks-filter", "0", "job.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    files = logs.rank_logs(str(log_dir))
    assert {r: (s["stdout"], s["stderr"]) for r, s in files.items()} == {
        r: (f"out of rank {r}\n", f"err of rank {r}\n") for r in (0, 1)}
    # the lesson's claim: the filter keeps the console to rank 0, the files keep everything
    assert "out of rank 0" in done.stdout and "rank 1" not in done.stdout + done.stderr


def test_rank_logs_says_what_to_do_when_there_are_none(tmp_path):
    with pytest.raises(FileNotFoundError, match="--log-dir"):
        logs.rank_logs(str(tmp_path))


# ----------------------------------------------------------------------------- TensorBoard


def _write_loss(log_dir, per_rank_folder, steps=4):
    from torch.utils.tensorboard import SummaryWriter

    rank = dist.get_rank()
    writer = SummaryWriter(os.path.join(log_dir, f"rank{rank}") if per_rank_folder else log_dir)
    for step in range(steps):
        writer.add_scalar("loss", 10.0 * rank + step, step)
    writer.close()


def test_dashboard_runs_one_run_per_folder(tmp_path):
    run(_write_loss, str(tmp_path / "sep"), True, world_size=3, echo=False)
    run(_write_loss, str(tmp_path / "one"), False, world_size=3, echo=False)
    assert logs.dashboard_runs(str(tmp_path / "sep"), "loss") == {
        f"rank{r}": [(s, 10.0 * r + s) for s in range(4)] for r in range(3)}
    assert [f.split("/")[0] for f in logs.event_files(str(tmp_path / "sep"))] == ["rank0", "rank1", "rank2"]
    (points,) = logs.dashboard_runs(str(tmp_path / "one"), "loss").values()
    assert len(logs.event_files(str(tmp_path / "one"))) == 3
    assert sorted(points) == sorted((s, 10.0 * r + s) for r in range(3) for s in range(4))
    assert logs.dashboard_runs(str(tmp_path / "one"), "no such tag") == {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Dashboard:
    """`tensorboard --logdir` on a free port, answered over HTTP, stopped on exit."""

    def __init__(self, log_dir, *flags):
        self.port = _free_port()
        state = log_dir.parent / f"tensorboard-state-{self.port}"   # its .tensorboard-info goes here
        state.mkdir()
        self.proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir),
                                      "--host", "127.0.0.1", "--port", str(self.port), *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=dict(os.environ, TMPDIR=str(state)))

    def get(self, path, deadline=120):
        end = time.monotonic() + deadline
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                    return json.loads(r.read())
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise
                time.sleep(0.2)  # polling a server that is still starting, bounded by the deadline

    def runs(self):
        """The runs once every one is loaded (the server loads the folders in the background)."""
        end = time.monotonic() + 120
        while True:
            found = self.get("/data/runs")
            if found and all(self.get(f"/data/plugin/scalars/scalars?run={r}&tag=loss") for r in found):
                return found
            assert time.monotonic() < end, f"the dashboard did not load its runs: {found}"
            time.sleep(0.2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(timeout=30)


def test_the_dashboard_shows_a_run_per_rank_folder_and_one_rank_of_a_shared_folder(tmp_path):
    run(_write_loss, str(tmp_path / "sep"), True, world_size=3, echo=False)
    run(_write_loss, str(tmp_path / "one"), False, world_size=3, echo=False)
    ranks = [[10.0 * r + s for s in range(4)] for r in range(3)]
    with _Dashboard(tmp_path / "sep") as board:
        assert sorted(board.runs()) == ["rank0", "rank1", "rank2"]
    with _Dashboard(tmp_path / "one") as board:          # the default, fast loader
        assert board.runs() == ["."]
        values = [v for _, step, v in board.get("/data/plugin/scalars/scalars?run=.&tag=loss")]
        assert values in ranks                            # one value per step: one rank's curve
    with _Dashboard(tmp_path / "one", "--load_fast=false") as board:
        assert board.runs() == ["."]
        points = board.get("/data/plugin/scalars/scalars?run=.&tag=loss")
        assert sorted(v for _, _, v in points) == sorted(sum(ranks, []))   # every rank's values


# ----------------------------------------------------------------------------- collectives


def _collectives():
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size()
    pair = torch.ones(2, dtype=torch.float64)
    counted = {
        "all_reduce": logs.count_collectives(dist.all_reduce, pair)[1],
        "two all_reduces": logs.count_collectives(lambda: [dist.all_reduce(p) for p in pair.tensor_split(2)])[1],
        "all_gather_object": logs.count_collectives(dist.all_gather_object, [None] * world, 1.5)[1],
        "barrier": logs.count_collectives(dist.barrier)[1],
        "nothing": logs.count_collectives(lambda: pair * 2)[1],
    }
    ddp = DDP(nn.Linear(4, 1))

    def three_steps():
        for _ in range(3):
            ddp(torch.randn(5, 4)).sum().backward()

    counted["ddp"] = logs.count_collectives(three_steps)[1]
    value, _ = logs.count_collectives(lambda: 41 + 1)
    return {k: dict(v) for k, v in counted.items()}, value


def test_count_collectives_counts_each_collective_however_it_was_called():
    (counted, value), *others = run(_collectives, world_size=3, echo=False)
    assert all(o == (counted, value) for o in others) and value == 42
    assert counted["all_reduce"] == {"all_reduce": 1}
    assert counted["two all_reduces"] == {"all_reduce": 2}
    assert counted["all_gather_object"] == {"all_gather": 2}
    assert counted["barrier"] == {"barrier": 1}
    assert counted["nothing"] == {}
    assert counted["ddp"]["all_reduce"] == 3       # DDP's gradient all_reduce, one bucket per step


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("world_size", range(1, 9))
def test_sorted_shards_are_equal_blocks_of_the_sorted_data(world_size):
    x, y = logs.sorted_data()
    shards = [logs.sorted_shard(r, world_size) for r in range(world_size)]
    assert {len(sx) for sx, _ in shards} == {len(x) // world_size}
    assert torch.equal(torch.cat([sx for sx, _ in shards]), x) and torch.equal(torch.cat([sy for _, sy in shards]), y)
    assert bool((y[1:] >= y[:-1]).all())


def test_fast_dashboard_runs_is_what_the_default_dashboard_serves(tmp_path):
    run(_write_loss, str(tmp_path / "sep"), True, world_size=3, echo=False)
    run(_write_loss, str(tmp_path / "one"), False, world_size=3, echo=False)
    ranks = [[(s, 10.0 * r + s) for s in range(4)] for r in range(3)]
    assert logs.fast_dashboard_runs(str(tmp_path / "sep"), "loss") == {f"rank{r}": ranks[r] for r in range(3)}
    (points,) = logs.fast_dashboard_runs(str(tmp_path / "one"), "loss").values()
    assert points in ranks                                # one value per step: one rank's curve
    with _Dashboard(tmp_path / "one") as board:          # the dashboard itself, with its defaults
        board.runs()
        served = [(step, v) for _, step, v in board.get("/data/plugin/scalars/scalars?run=.&tag=loss")]
    assert served == points
    assert logs.fast_dashboard_runs(str(tmp_path / "one"), "no such tag") == {}
    with pytest.raises(FileNotFoundError, match="write the event files there first"):
        logs.fast_dashboard_runs(str(tmp_path / "missing"), "loss")
