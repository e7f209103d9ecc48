"""Plumbing for the logging lessons: ``beginner/02_every_clerk_talks``,
``developer/04_logging_from_one_rank`` and ``researcher/04_metrics_over_time``.

The lessons' point (who prints, who writes the event file, the ``[sum, count]`` reduction, the
``if rank == 0:``) is written in the notebooks' own cells; this module holds only what is not:

* :func:`run_and_capture` -- :func:`helpers.spawn.run`, and the lines the ranks printed, as
  the cell showed them, in the order they arrived.
* :func:`on_screen` -- what a line drawn with carriage returns (a progress bar) finally shows.
* :func:`rank_logs` -- the per-rank files ``torchrun --log-dir ... --redirects`` wrote.
* :func:`dashboard_runs`, :func:`event_files` -- TensorBoard's runs and scalars, read with
  TensorBoard's own event reader, as its dashboard would list them.
* :func:`fast_dashboard_runs` -- the same, as the default dashboard's own data server serves them.
* :func:`count_collectives` -- inside a rank: which collectives a function started, however
  it called them.
* :func:`sorted_shard`, :func:`sorted_data` -- a regression data set stored sorted by its
  target, so each rank's block of it has a very different loss.

Importing it changes nothing (no seeding, no plotting style, no process started).
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import sys
from typing import Callable

__all__ = ["run_and_capture", "on_screen", "rank_of", "rank_logs", "dashboard_runs",
           "fast_dashboard_runs", "event_files", "count_collectives", "sorted_data", "sorted_shard"]


# ----------------------------------------------------------------------------- what a cell shows


class _Tee(io.TextIOBase):
    """Writes go to the cell's stream and to one shared buffer (stdout and stderr interleaved)."""

    def __init__(self, stream, buffer: io.StringIO):
        self.stream, self.buffer = stream, buffer

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.buffer.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def run_and_capture(fn: Callable, *args, show: bool = True, **kwargs) -> tuple[list, list[str]]:
    """``run(fn, *args, **kwargs)`` from :mod:`helpers.spawn`, returning ``(values, lines)``.

    ``lines`` are the ``[rank r] ...`` lines the pool printed (stdout and stderr, in the order
    they arrived). ``show=False`` keeps them out of the cell; they are returned all the same.
    """
    from helpers.spawn import run

    buffer = io.StringIO()
    out = _Tee(sys.stdout, buffer) if show else buffer
    err = _Tee(sys.stderr, buffer) if show else buffer
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        values = run(fn, *args, echo=True, **kwargs)
    # split on newlines only: a progress bar's carriage returns stay inside its line
    return values, [line for line in buffer.getvalue().split("\n") if line]


def on_screen(line: str) -> str:
    """What a terminal or a notebook finally shows for ``line``: the text after its last
    carriage return (a progress bar redraws itself with ``\\r``)."""
    frames = [f for f in line.split("\r") if f.strip()]
    return frames[-1] if frames else ""


_TAG = re.compile(r"^\[rank (\d+)\] ")


def rank_of(line: str) -> int | None:
    """The rank that printed a line the pool showed (``"[rank 2] ..."`` -> 2)."""
    found = _TAG.match(line)
    return int(found.group(1)) if found else None


# ----------------------------------------------------------------------------- torchrun


def rank_logs(log_dir: str) -> dict[int, dict[str, str]]:
    """``{rank: {"stdout": text, "stderr": text}}`` from what ``torchrun --log-dir log_dir
    --redirects ...`` (or ``--tee``) wrote: one folder per rank,
    ``<log_dir>/<run id>/attempt_<n>/<rank>/std{out,err}.log``, of the last attempt."""
    attempts = sorted(glob.glob(os.path.join(log_dir, "*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        raise FileNotFoundError(f"no torchrun logs under {log_dir}: was it run with --log-dir "
                                "and --redirects (or --tee)?")
    found: dict[int, dict[str, str]] = {}
    for folder in sorted(os.listdir(attempts[-1]), key=int):
        streams = {}
        for name in ("stdout", "stderr"):
            path = os.path.join(attempts[-1], folder, f"{name}.log")
            if os.path.exists(path):
                with open(path) as f:
                    streams[name] = f.read()
        found[int(folder)] = streams
    return found


# ----------------------------------------------------------------------------- TensorBoard


def event_files(log_dir: str) -> list[str]:
    """Every TensorBoard event file under ``log_dir``, relative to it, sorted."""
    pattern = os.path.join(log_dir, "**", "events.out.tfevents.*")
    return sorted(os.path.relpath(p, log_dir) for p in glob.glob(pattern, recursive=True))


def dashboard_runs(log_dir: str, tag: str) -> dict[str, list[tuple[int, float]]]:
    """The runs ``tensorboard --logdir log_dir`` lists, each with its ``(step, value)`` points
    of the scalar ``tag``, in the order they were read.

    Uses TensorBoard's own rules and reader: every folder that holds event files is one run
    (named by its path under ``log_dir``, ``"."`` for ``log_dir`` itself), and all the event
    files of a folder are read into that one run by ``EventAccumulator`` (what
    ``tensorboard --load_fast=false`` shows). The default dashboard's fast loader keeps one
    value per step of a run instead: for a folder several ranks wrote into, one rank's values.
    """
    from tensorboard.backend.event_processing import io_wrapper
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {}
    for folder in sorted(io_wrapper.GetLogdirSubdirectories(log_dir)):
        acc = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every point
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            runs[os.path.relpath(folder, log_dir)] = [(e.step, e.value) for e in acc.Scalars(tag)]
    return runs


def fast_dashboard_runs(log_dir: str, tag: str, timeout: float = 60) -> dict[str, list[tuple[int, float]]]:
    """What the default dashboard (``tensorboard --logdir log_dir``) serves for the scalar ``tag``:
    ``{run: [(step, value), ...]}``, asked of its own fast data server.

    That server (``tensorboard_data_server``, the binary ``tensorboard`` starts unless given
    ``--load_fast=false``) is started on ``127.0.0.1``, on a free port, to load ``log_dir`` once;
    once it logs that its load cycle has finished, every run's points are read over its gRPC
    interface, and the server is stopped, whatever happens. ``TimeoutError`` if it has not
    finished loading within ``timeout`` seconds.
    """
    import subprocess
    import tempfile
    import time

    import grpc
    from tensorboard.data import grpc_provider
    from tensorboard.data.proto import data_provider_pb2
    from tensorboard_data_server import server_binary

    if not os.path.isdir(log_dir):
        raise FileNotFoundError(f"no folder {log_dir}: write the event files there first (SummaryWriter({log_dir!r}))")
    with tempfile.TemporaryDirectory(prefix="tb-data-server-") as tmp:
        port_file, log_file = os.path.join(tmp, "port"), os.path.join(tmp, "server.log")
        with open(log_file, "w") as log:
            server = subprocess.Popen([server_binary(), f"--logdir={log_dir}", "--host=127.0.0.1", "--port=0",
                                       f"--port-file={port_file}", "--reload=once", "--die-after-stdin", "-v"],
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
        try:
            end = time.monotonic() + timeout
            while "Finished load cycle" not in open(log_file).read():
                if server.poll() is not None or time.monotonic() > end:
                    raise TimeoutError(f"TensorBoard's data server did not load {log_dir} within {timeout} s "
                                       f"(exit code {server.poll()}): {open(log_file).read()[-500:]}")
                time.sleep(0.02)  # polling a server that is still loading, bounded by the deadline
            with open(port_file) as f:
                port = int(f.read())
            request = data_provider_pb2.ReadScalarsRequest()
            request.plugin_filter.plugin_name = "scalars"
            request.run_tag_filter.tags.names.append(tag)
            request.downsample.num_points = 1_000_000          # every point it holds
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                answer = grpc_provider.make_stub(channel).ReadScalars(request, timeout=timeout)
        finally:
            server.stdin.close()
            server.kill()
            server.wait()
    return {run.run_name: [(step, value) for series in run.tags
                           for step, value in zip(series.data.step, series.data.value)]
            for run in answer.runs}


# ----------------------------------------------------------------------------- collectives


def count_collectives(fn: Callable, *args, **kwargs):
    """Inside a rank: ``(value, counts)``, where ``value`` is ``fn(*args, **kwargs)`` and
    ``counts`` a ``collections.Counter`` of the collectives started meanwhile
    (``{"all_reduce": 3, "all_gather": 2, "barrier": 1, ...}``).

    Every collective of ``torch.distributed`` reaches the backend through a dispatcher
    operator (``c10d::allreduce_``...), whether it was called as ``dist.all_reduce``, inside
    ``all_gather_object``, by DDP's backward or by a library's ``compute()``; a
    ``TorchDispatchMode`` sees each one pass (and lets it run unchanged). A call that runs two
    collectives counts two.
    """
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter = Counter()

    class _Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            namespace, _, name = str(func.overloadpacket).rpartition(".")
            if namespace in ("c10d", "_c10d_functional"):
                name = name.strip("_")
                counts[_COLLECTIVE_NAMES.get(name, name)] += 1
            return func(*args, **(kwargs or {}))

    with _Watch():
        value = fn(*args, **kwargs)
    return value, counts


_COLLECTIVE_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather",
                     "allgather_into_tensor_coalesced": "all_gather", "allgather_base": "all_gather",
                     "all_gather_into_tensor": "all_gather", "reduce_scatter": "reduce_scatter",
                     "alltoall": "all_to_all", "alltoall_base": "all_to_all"}


# ----------------------------------------------------------------------------- data


def sorted_data(n: int = 840):
    """``(x, y)``: ``n`` examples of a noisy linear target, stored sorted by the target (as a
    file sorted by date, size or label is). Split in blocks, every rank gets a different kind
    of example: low targets on rank 0, high ones on the last rank."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[0.5], [-1.0], [0.25], [2.0]]) + 0.3 * torch.randn(n, 1, generator=g)
    order = torch.argsort(y[:, 0])
    return x[order], y[order]


def sorted_shard(rank: int, world_size: int, n: int = 840):
    """Rank ``rank``'s contiguous block of :func:`sorted_data` (``n`` divisible by the world
    size keeps the blocks equal, so DDP's averaged gradient is the full-batch gradient; 840 is
    divisible by every world size from 1 to 8)."""
    import torch

    x, y = sorted_data(n)
    mine = torch.tensor_split(torch.arange(n), world_size)[rank]
    return x[mine], y[mine]
