"""Plumbing for the developer lesson's demos (``solutions/developer/01_save_log_resume.ipynb``,
``02_common_mistakes.ipynb``, ``03_sharded_checkpoints.ipynb``, ``05_checkpointing_in_practice.ipynb``).

The lesson's point (the ``if rank == 0:`` save, the ``dist.barrier()``, the ``[sum, count]``
all_reduce) is written in the notebooks' own cells; this module only holds what is not the
lesson: running a torchrun script inside a pool's rank, making a checkpoint that looks as if it
was saved on a GPU, and comparing two state dicts (the figures are in :mod:`helpers.lessons.figures`).

Importing it changes nothing (no seeding, no plotting style, no process started).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any, Iterator

__all__ = ["pretend_saved_on", "run_script", "first_difference", "same", "sigkill_mid_write",
           "file_size_limit", "folder", "file_mode", "plain_open_mode", "toy_job", "scheduler_sends_sigterm", "tiny_ddp", "seed_all",
           "wilson_interval", "torchrun", "TorchrunResult", "gradient_all_reduces"]


# ----------------------------------------------------------------------------- checkpoints


@contextlib.contextmanager
def pretend_saved_on(location: str = "cuda:0") -> Iterator[None]:
    """Inside this block, ``torch.save`` records every tensor's device as ``location``.

    A checkpoint written on a GPU stores, next to each tensor's bytes, the device it came
    from (``"cuda:0"``); ``torch.load`` puts the tensor back there unless ``map_location``
    says otherwise. This machine has no GPU, so the lesson makes such a file by registering a
    device tagger with ``torch.serialization.register_package`` (the mechanism torch itself
    uses to tag storages) for the duration of the block. The bytes are exactly what a GPU
    save writes for these tensors' location.
    """
    import torch.serialization as ser

    def tagger(storage):
        return location

    def no_restore(storage, where):  # loading is left to torch's own deserialisers
        return None

    ser.register_package(-1000, tagger, no_restore)
    entry = next(e for e in ser._package_registry if e[1] is tagger)
    try:
        yield
    finally:
        ser._package_registry.remove(entry)


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


def run_script(script: str, workdir: str, args: tuple = ()) -> list[str]:
    """Run a torchrun-style script unchanged inside the calling rank, from ``workdir``.

    Meant for ``helpers.spawn.run(run_script, path, workdir, init_process_group=False)``:
    the pool sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... as torchrun does, and the script
    calls ``dist.init_process_group`` itself. Its output still streams into the cell; the
    printed lines are also returned, so the notebook can assert them. ``args`` are the script's
    command-line arguments (its ``sys.argv[1:]``, e.g. ``("--backend", "gloo")``); a rank would
    otherwise see the notebook kernel's own arguments.
    """
    import runpy

    script = os.path.abspath(script)
    captured = io.StringIO()
    os.chdir(workdir)
    old, old_argv = sys.stdout, sys.argv
    sys.stdout = _Tee(old, captured)
    sys.argv = [script, *args]
    try:
        # The script's globals (its model, DDP's reducer, the process group) stay referenced
        # until the rank process ends (a pool's rank ends with os._exit, running no destructors).
        # Seen once under heavy load: a rank blocked for 60 s after the script's last line, inside
        # run_path's cleanup, while its peer had finished; destroying the script's objects there,
        # after the peer has gone, is the one thing that cleanup does.
        _SCRIPT_GLOBALS.append(runpy.run_path(script, run_name="__main__"))
    finally:
        sys.stdout, sys.argv = old, old_argv
    return captured.getvalue().splitlines()


_SCRIPT_GLOBALS: list[dict] = []


# ----------------------------------------------------------------------------- state dicts


def first_difference(a: Any, b: Any, where: str = "", close: bool = False) -> str | None:
    """Where two (nested) state dicts differ, e.g. ``"['state'][0]['momentum_buffer']"``; None if
    equal. ``close``: tensors need only agree to float32 rounding (one computed in another order)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return where or "(top level)"
        if a.shape != b.shape:
            return where or "(top level)"
        a = a.to(b.dtype)
        if not (torch.allclose(a, b, rtol=1e-5, atol=1e-7) if close and b.is_floating_point()
                else torch.equal(a, b)):
            return where or "(top level)"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where} keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            found = first_difference(a[k], b[k], f"{where}[{k!r}]", close)
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{where}[{i}]", close)
            if found:
                return found
        return None
    return None if a == b else (where or "(top level)")


def same(a: Any, b: Any) -> bool:
    """True when two (nested) state dicts hold equal tensors and values under the same keys."""
    return first_difference(a, b) is None


# ----------------------------------------------------------------------------- checkpointing in practice
# (05_checkpointing_in_practice.ipynb)


@contextlib.contextmanager
def sigkill_mid_write(fraction: float = 0.5) -> Iterator[None]:
    """Inside this block, the first ``torch.save`` to a file gets its process killed half-way.

    ``fraction`` of the checkpoint's bytes reach the file (handed to the operating system, as a
    real write in progress has), then the process sends itself a real ``SIGKILL``: no Python
    code runs after it, no ``finally``, no cleanup, exactly as when the kernel's out-of-memory
    killer or a node failure stops a job. A real kill lands at a random moment; this one lands
    in the middle of the write on every run, the moment that matters.

    Every ``torch.save`` to a path or an open file is caught, however it was imported
    (:func:`helpers.lessons.races.hook_torch_save`); saves into memory are left alone.
    """
    import signal

    from helpers.lessons.races import BufferedSave, hook_torch_save, write_slowly

    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be between 0 and 1 (a part of the file), got {fraction}")

    class DiesMidway(BufferedSave):
        def publish(self, data: bytes) -> None:
            write_slowly(data[:int(len(data) * fraction)], self.target, chunks=1)  # on disk, then the kill
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    with hook_torch_save(DiesMidway):
        yield


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Inside this block, this process cannot write a file past ``size`` bytes (05_checkpointing_in_practice.ipynb).

    The kernel enforces it (``RLIMIT_FSIZE``, as ``ulimit -f`` sets it): a write that would go
    past the limit fails with ``EFBIG`` ("File too large"), which is what a full disk or an
    exhausted quota does to a write, however the writer was called (threads included: the
    limit is the process's). Python ignores the ``SIGXFSZ`` the kernel also sends, so the write
    raises instead of killing the process. The previous limit is restored on the way out.
    """
    import resource

    if size < 0:
        raise ValueError(f"size is a number of bytes, 0 or more; got {size}")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and size > hard:
        raise ValueError(f"size {size} is above this process's hard file-size limit, {hard} bytes")
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def folder(path: str) -> list[str]:
    """The names in ``path``, sorted (an empty list if it does not exist)."""
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def file_mode(path: str) -> str:
    """A file's permission bits as ``ls -l`` shows them, e.g. ``"rw-r--r--"``."""
    import stat

    return stat.filemode(os.stat(path).st_mode)[1:]


def plain_open_mode() -> str:
    """The permissions a plain ``open(path, "w")`` gives a new file in this process: 0o666 minus the umask."""
    import stat

    mask = os.umask(0)
    os.umask(mask)
    return stat.filemode(stat.S_IFREG | (0o666 & ~mask))[1:]


def toy_job():
    """The model, optimizer and data set of the exact-resume demo; identical on every rank.

    A small regression network with dropout (so each step draws random numbers), SGD with
    momentum (so the optimizer has state), and 48 samples. Seeds only its own generators
    (``torch.manual_seed(0)`` for the weights, as the lessons' scripts do); the per-rank
    randomness of training is seeded by the notebook.
    """
    import torch
    import torch.nn as nn
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, data


def scheduler_sends_sigterm(step: int, at_step: int, to_rank: int) -> None:
    """Play the scheduler: deliver a real ``SIGTERM`` to rank ``to_rank`` when it reaches ``at_step``.

    A cluster scheduler (or ``torchrun``'s agent, which forwards the signal to its workers)
    sends ``SIGTERM`` when it wants a job's processes to stop, and ``SIGKILL`` after a grace
    period. It arrives at whatever step each process happens to be in; here it arrives at a
    known step of one rank, so that the demo repeats exactly.
    """
    import signal

    import torch.distributed as dist

    if dist.get_rank() == to_rank and step == at_step:
        os.kill(os.getpid(), signal.SIGTERM)


def tiny_ddp(lr: float = 0.1):
    """A DDP-wrapped ``nn.Linear(8, 1)`` (seed 0, the same on every rank) and its SGD optimizer."""
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(nn.Linear(8, 1))
    return ddp, torch.optim.SGD(ddp.parameters(), lr=lr)


def seed_all(seed: int) -> None:
    """Seed torch's, numpy's and Python's global generators with ``seed``."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


# ----------------------------------------------------------------------------- measurements
# (developer/02_common_mistakes: the race at real speed, hangs under torchrun, DDP's buckets)


def wilson_interval(failures: int, runs: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate seen as ``failures`` out of ``runs``.

    Unlike ``p ± 1.96·sqrt(p(1-p)/n)`` it stays inside [0, 1] and is not empty when every run
    failed (or none did), which is what a race measured a few dozen times often gives.
    """
    if runs <= 0:
        raise ValueError(f"runs must be positive, got {runs}")
    if not 0 <= failures <= runs:
        raise ValueError(f"failures must be between 0 and runs ({runs}), got {failures}")
    p = failures / runs
    denominator = 1 + z * z / runs
    centre = (p + z * z / (2 * runs)) / denominator
    half = z * (p * (1 - p) / runs + z * z / (4 * runs * runs)) ** 0.5 / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


class TorchrunResult:
    """What a ``torchrun`` launch did: ``returncode``, ``seconds``, ``output`` (stdout and stderr)."""

    def __init__(self, returncode: int, seconds: float, output: str):
        self.returncode, self.seconds, self.output = returncode, seconds, output

    def lines(self, *needles: str) -> list[str]:
        """The output lines holding any of ``needles``, each once, without torch's log prefixes."""
        import re

        seen, found = set(), []
        for line in self.output.splitlines():
            if any(n in line for n in needles):
                line = re.sub(r"^\[rank\d+\]:\s*", "", line).strip()
                line = re.sub(r"\[[^\]]*third_party/gloo/[^\]]*\]\s*", "", line)
                if line not in seen:
                    seen.add(line)
                    found.append(line)
        return found


def torchrun(source: str, nproc: int = 2, timeout: float = 180) -> TorchrunResult:
    """Write ``source`` to a temporary script and run it with ``torchrun --nproc_per_node=nproc``.

    The real launcher, as in a terminal: every rank is a process that exits when the script
    ends. ``timeout`` bounds the whole launch (the job is killed after it, and that is reported
    as a ``TimeoutError``); the temporary folder is removed afterwards.
    """
    import shutil
    import subprocess
    import tempfile
    import textwrap
    import time

    folder = tempfile.mkdtemp(prefix="torchrun-")
    script = os.path.join(folder, "job.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(source))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           script]
    # TMPDIR: torchrun's own log folders (torchelastic_*) go into the folder removed below
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TMPDIR=folder)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)  # torchrun's workers run in sessions of their own
        proc.communicate()
        raise TimeoutError(f"torchrun did not finish in {timeout:.0f} s; the job was killed") from None
    except BaseException:      # interrupted: nothing is left running
        _kill_tree(proc.pid)
        proc.communicate()
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return TorchrunResult(proc.returncode, time.monotonic() - t0, output)


def _kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process below it, including one it is starting at that moment.

    Each process is stopped (SIGSTOP) before its children are listed, so none can start another
    one after the list is made (a launcher killed while it starts its workers would leave them
    running); then everything listed is killed."""
    import signal

    import psutil

    try:
        family = [psutil.Process(pid)]
    except psutil.NoSuchProcess:
        return
    seen = set()
    while True:
        for p in family:
            if p.pid not in seen:
                seen.add(p.pid)
                try:
                    p.send_signal(signal.SIGSTOP)
                except psutil.NoSuchProcess:
                    pass
        found = []
        for p in family:
            try:
                found += p.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        new = [c for c in found if c.pid not in seen]
        if not new:
            break
        family += new
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)


def gradient_all_reduces(ddp, x) -> dict:
    """Profile one ``ddp(x).sum().backward()`` (after a first one, which builds the buckets).

    Returns how many gradient all_reduces it launched (``"all_reduces"``), how many of them were
    launched while backward still had gradients to compute, i.e. before the last autograd node
    started (``"during_backward"``), and the number of parameter tensors (``"parameters"``).
    """
    from torch.profiler import ProfilerActivity, profile

    ddp(x).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ddp(x).sum().backward()
    events = list(prof.events())
    starts = [e.time_range.start for e in events if e.name == "c10d::allreduce_"]
    last_gradient = max(e.time_range.start for e in events
                        if e.name.startswith("autograd::engine::evaluate_function"))
    return {"all_reduces": len(starts), "during_backward": sum(s < last_gradient for s in starts),
            "parameters": sum(1 for _ in ddp.module.parameters())}
