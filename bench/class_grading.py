"""A class graded: serial `nbgrader autograde` against `course_tools.grade` with 1, 2, 3 workers
and a Dask cluster of 2 workers, in the same run, on the same submissions.

The class: BENCH_CLASS submissions (default 24) of the beginner depth's exercises, half of them
the reference answers, a third wrong (every answer returns None), a sixth hanging (a barrier only
rank 0 reaches). Printed per run: wall time, throughput, CPU-s per submission (everything the run
used: the instructor's process, and each submission's grading process with its sandboxed kernel
and ranks, counted exactly by the submission's cgroup, on a Dask worker too), and the speed-up
over serial nbgrader; whether every student's scores are equal (naming the students and tests
that differ). Target (issue 22): at least 1.8x over serial nbgrader with equal scores.

Then a model of a grading run, its inputs measured in the 1-worker run (:class:`Model`): per
submission, the slot's wall seconds and the CPU-s it costs, the writer's seconds (the instructor's
process reruns nbgrader's converter for each submission, one at a time: a floor nothing parallel
removes), and the fixed start-up (preflight). From it: what a 16-core grading machine and a
cluster of 4 such machines would take for a class of 1000 (slots limited by cores and memory),
and, checked against a measurement, what the 2-worker Dask run should take: MET when the
prediction is within DASK_TOLERANCE of the measured time.

Knobs (environment): BENCH_CLASS (submissions), BENCH_CLASS_WORKERS (local runs, default
"1,2,3"; the model needs the 1-worker run), BENCH_CLASS_DASK (0: no Dask run), BENCH_CLASS_PREFLIGHT
(0: the course's preflight off in every run, serial nbgrader's too),
BENCH_MACHINE_GIB (memory of the 16-core machine of the estimate, default 64).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from bench.grading import HANG
from course_tools import ROOT, venv_env
from course_tools.selfcheck import graded_notebooks
from course_tools.temp_course import fill, make_course, read_scores, reference_answers

DEPTH = "beginner"
WRONG = "return None"
#: The speed-up over serial nbgrader the issue asks for, with equal scores.
TARGET = 1.8
#: How far the model's prediction of the 2-worker Dask run may be from the measured time.
DASK_TOLERANCE = 0.25
#: The class of the estimates, and the machines.
CLASS, BIG_CORES, MACHINES = 1000, 16, 4


# ============================================================================ the model


@dataclass
class Model:
    """A grading run as slots that each grade one submission at a time, the CPU they share, and
    one writer. Inputs are means per submission from a measured run with one slot."""

    startup: float  # seconds before the first task goes out (start-up, preflight): paid once
    task_seconds: float  # wall seconds one slot takes per submission, without other slots
    task_cpu: float  # CPU-s of one submission's grading (its process, kernel and ranks)
    write_seconds: float  # the writer's seconds per submission (serial: one writer)
    write_cpu: float  # the writer's CPU-s per submission (on the instructor's machine)

    def rate(self, machines: int, cores: int, slots: int, writer_shares_cores: bool) -> tuple[float, str]:
        """Submissions per second, and what limits it: the slots (each busy task_seconds per
        submission), the CPU (all cores busy: task_cpu per submission, plus the writer's when it
        runs on a grading machine) or the writer (one submission per write_seconds)."""
        cpu = machines * cores / (self.task_cpu + (self.write_cpu if writer_shares_cores else 0.0))
        limits = {"the slots": machines * slots / self.task_seconds, "the CPU": cpu,
                  "the writer": 1.0 / self.write_seconds if self.write_seconds > 0 else math.inf}
        why = min(limits, key=limits.get)
        return limits[why], why

    def wall(self, n: int, machines: int, cores: int, slots: int, writer_shares_cores: bool) -> tuple[float, str]:
        """Seconds to grade ``n`` submissions: the start-up, ``n`` at the rate, the last write."""
        rate, why = self.rate(machines, cores, slots, writer_shares_cores)
        return self.startup + n / rate + self.write_seconds, why


def slots_for(cores: int, memory_gib: float) -> int:
    """The default slots of ``course_tools.grade`` on such a machine (its rule)."""
    from course_tools.grade import slots_allowed

    return slots_allowed(cores, int(memory_gib * 2**30), budgeted=True)[0]


def model_from(stats: dict, wall: float) -> Model:
    """The model's inputs from a ``course_tools.grade --stats`` file of a 1-worker run that took
    ``wall`` seconds (its start-up: the process's start and imports, which the file does not
    see, and what it counts before the first task goes out: config, preflight, the gradebook)."""
    subs = list(stats["submissions"].values())
    graded = [s for s in subs if s.get("write_seconds") is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    outside = max(0.0, wall - stats.get("wall_seconds", wall))
    return Model(startup=outside + stats["startup_seconds"],
                 task_seconds=mean([s["seconds"] for s in subs if s.get("seconds") is not None]),
                 task_cpu=mean([s["cpu_seconds"] for s in subs if s.get("cpu_seconds") is not None]),
                 write_seconds=mean([s["write_seconds"] for s in graded]),
                 write_cpu=mean([s["write_cpu"] for s in graded]))


def verdict(predicted: float, measured: float, tolerance: float = DASK_TOLERANCE) -> tuple[bool, float]:
    """(whether ``predicted`` is within ``tolerance`` of ``measured``, their relative difference)."""
    off = (predicted - measured) / measured
    return abs(off) <= tolerance, off


def differences(scores: dict[str, dict[str, dict[str, float]]], reference: str) -> list[str]:
    """One line per student (and run) whose scores differ from the ``reference`` run's, naming
    the tests."""
    lines = []
    base = scores[reference]
    for label, run in scores.items():
        if label == reference:
            continue
        for student in base:
            a, b = base[student], run.get(student, {})
            if a != b:
                differ = sorted(g for g in set(a) | set(b) if a.get(g) != b.get(g))
                shown = ", ".join(f"{g} ({a.get(g)} vs {b.get(g)})" for g in differ)
                lines.append(f"{label}: {student} differs from {reference} in {shown}")
    return lines


# ============================================================================ the runs


def make_class(tmp: Path, n: int, preflight: bool = True) -> tuple[Path, list[str], list[str]]:
    course = make_course(tmp, [DEPTH])
    if not preflight:
        with open(course / "nbgrader_config.py", "a") as f:
            f.write("\nc.CourseExecute.preflight = False\n")
    (source,) = graded_notebooks(ROOT / "solutions" / DEPTH)
    kinds = {"right": reference_answers(source), "wrong": reference_answers(source, WRONG),
             "hangs": reference_answers(source, HANG)}
    students = []
    for k in range(n):
        kind = "hangs" if k % 6 == 5 else "wrong" if k % 3 == 1 else "right"
        student = f"{kind}{k:03d}"
        dest = course / "submitted" / student / DEPTH
        dest.mkdir(parents=True)
        nbformat.write(fill(course / "notebooks" / DEPTH / source.name, kinds[kind]), dest / source.name)
        students.append(student)
    return course, students, [source.stem]


def timed(cmd, cwd, env=None) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env or venv_env(), capture_output=True, text=True, timeout=7200)
    seconds = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


class Cluster:
    """`dask scheduler` and two `dask worker`s on 127.0.0.1, each in its own folder; stopped
    whatever happens (a context manager)."""

    def __init__(self, folder: Path, workers: int = 2):
        self.folder, self.workers, self.procs = folder, workers, []

    def __enter__(self):
        import socket

        from distributed import Client

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        try:
            self.procs.append(subprocess.Popen(
                [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                cwd=self.folder, env=venv_env(TMPDIR=str(self.folder)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for i in range(self.workers):
                wdir = self.folder / f"worker{i}"
                wdir.mkdir()
                self.procs.append(subprocess.Popen(
                    [dask, "worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                     "--local-directory", str(wdir)], cwd=wdir, env=venv_env(TMPDIR=str(wdir)),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            with Client(self.address, timeout=60) as client:
                client.wait_for_workers(self.workers, timeout=120)
        except BaseException:
            self.close()
            raise
        return self

    def cpu_seconds(self) -> float:
        """CPU-s the scheduler and workers used themselves (their tasks' processes are counted
        by the tasks)."""
        import psutil

        total = 0.0
        for p in self.procs:
            try:
                t = psutil.Process(p.pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()

    def __exit__(self, *exc):
        self.close()


@dataclass
class Run:
    label: str
    how: object  # None: serial nbgrader; an int: local workers; "dask"
    seconds: float
    cpu: float | None  # CPU-s of the whole run
    exact: bool
    stats: dict | None = None


def run_serial(course: Path, tmp: Path, assignment: str) -> Run:
    out = tmp / "serial-cpu.json"
    seconds = timed([sys.executable, "-m", "bench.cpu_of", str(out), "autograde", assignment, "--log-level=ERROR"],
                    course, env=venv_env(PYTHONPATH=str(ROOT)))
    cpu = json.loads(out.read_text())
    return Run("nbgrader autograde (serial)", None, seconds, cpu["cpu_seconds"], cpu["cpu_exact"])


def _grade_run(label, how, course: Path, tmp: Path, assignment: str, *args) -> Run:
    out = tmp / f"stats-{how}.json"
    seconds = timed([sys.executable, "-m", "course_tools.grade", assignment, "--stats", str(out), *args], course)
    stats = json.loads(out.read_text())
    tasks = [s for s in stats["submissions"].values() if s.get("cpu_seconds") is not None]
    exact = stats["instructor_cpu_exact"] and all(s.get("cpu_exact") for s in tasks) \
        and len(tasks) == len(stats["submissions"])
    cpu = stats["instructor_cpu_seconds"] + sum(s["cpu_seconds"] for s in tasks)
    return Run(label, how, seconds, cpu, exact, stats)


def main() -> bool:
    """`make bench`'s class part, with the knobs of the environment (see the module's docstring)."""
    n = int(os.environ.get("BENCH_CLASS", "24"))
    local = [int(w) for w in os.environ.get("BENCH_CLASS_WORKERS", "1,2,3").split(",") if w.strip()]
    with_dask = os.environ.get("BENCH_CLASS_DASK", "1") != "0"
    preflight = os.environ.get("BENCH_CLASS_PREFLIGHT", "1") != "0"
    big_gib = float(os.environ.get("BENCH_MACHINE_GIB", "64"))
    print(f"\nclass grading: {n} submissions of {DEPTH} (half right, a third wrong, a sixth hanging)"
          + ("" if preflight else "; preflight off"), flush=True)
    return measure(lambda tmp: make_class(tmp, n, preflight), DEPTH, local, with_dask, big_gib)


def measure(make, assignment: str, local: list[int], with_dask: bool, big_gib: float = 64.0) -> bool:
    """Grade the class ``make(folder)`` returns (course, students, notebooks) with serial nbgrader,
    then ``course_tools.grade`` with each of ``local`` workers, then on a 2-worker Dask cluster,
    each on a fresh copy; print the report; True if every target is met."""
    cores = len(os.sched_getaffinity(0))
    print(f"  {cores} cores, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    runs: list[Run] = []
    scores: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        tmp = Path(tmp)
        base, students, notebooks = make(tmp / "base")
        plan = [("nbgrader autograde (serial)", None)] + \
            [(f"course_tools.grade --workers {w}", w) for w in local] + \
            ([("course_tools.grade on Dask, 2 workers", "dask")] if with_dask else [])
        for label, how in plan:
            course = tmp / f"run{len(runs)}"
            shutil.copytree(base, course)
            if how is None:
                run = run_serial(course, tmp, assignment)
            elif how == "dask":
                (tmp / "dask").mkdir()
                with Cluster(tmp / "dask") as cluster:
                    before = cluster.cpu_seconds()
                    run = _grade_run(label, how, course, tmp, assignment, "--scheduler", cluster.address)
                    run.cpu += cluster.cpu_seconds() - before
            else:
                run = _grade_run(label, how, course, tmp, assignment, "--workers", str(how))
            graded = read_scores(course, assignment, notebooks, students)
            scores[label] = {s: graded.scores[s] for s in students}
            runs.append(run)
            shutil.rmtree(course)
            print(f"  {label:<40} {run.seconds:7.0f} s", flush=True)
    return report(runs, scores, len(students), cores, big_gib)


def report(runs: list[Run], scores: dict, n: int, cores: int, big_gib: float) -> bool:
    """Print the table, the verdicts, the model and its estimates; True if every target is met."""
    serial = runs[0]
    print(f"\n  {'grader':<40} {'wall s':>7} {'per min':>8} {'CPU-s/sub':>10} {'speed-up':>9}")
    for r in runs:
        per = f"{r.cpu / n:9.1f}{'' if r.exact else '+'}" if r.cpu is not None else f"{'-':>10}"
        print(f"  {r.label:<40} {r.seconds:7.0f} {60 * n / r.seconds:8.1f} {per} {serial.seconds / r.seconds:8.2f}x")
    if not all(r.exact for r in runs):
        print("  (+: at least this much; some processes ran without a cgroup to count them)")
    print("  CPU-s/sub: every process of the run, the sandboxed kernels and ranks counted by their cgroups")
    lines = differences(scores, serial.label)
    equal = not lines
    print(f"  scores equal student by student in every run: {'yes' if equal else 'NO'}")
    for line in lines:
        print(f"    {line}")
    ok = equal
    parallel = [r for r in runs if isinstance(r.how, int) and r.how > 1]
    if parallel:
        best = max(parallel, key=lambda r: serial.seconds / r.seconds)
        met = serial.seconds / best.seconds >= TARGET and equal
        speedup = serial.seconds / best.seconds
        print(f"  target: >= {TARGET}x over serial nbgrader with equal scores: best {speedup:.2f}x "
              f"({best.label}) -> {'MET' if met else 'MISSED'}")
        ok &= met
    else:
        print(f"  target: >= {TARGET}x over serial nbgrader: not measured (no run with 2 or more workers)")
    one = next((r for r in runs if r.how == 1), None)
    if one is None:
        print("  model: not made (it needs the 1-worker run: BENCH_CLASS_WORKERS with 1)")
        return ok
    m = model_from(one.stats, one.seconds)
    print(f"\n  model (from the 1-worker run, per submission): a slot {m.task_seconds:.1f} s, "
          f"{m.task_cpu:.1f} CPU-s; the writer {m.write_seconds:.2f} s ({m.write_cpu:.2f} CPU-s), serial; "
          f"start-up {m.startup:.0f} s once")
    for r in parallel:
        predicted, why = m.wall(n, 1, cores, r.how, writer_shares_cores=True)
        print(f"    {r.label}: predicted {predicted:.0f} s (limited by {why}), measured {r.seconds:.0f} s")
    slots = slots_for(BIG_CORES, big_gib)
    one_big, why1 = m.wall(CLASS, 1, BIG_CORES, slots, writer_shares_cores=True)
    cluster, why4 = m.wall(CLASS, MACHINES, BIG_CORES, slots, writer_shares_cores=False)
    print(f"  estimate, a class of {CLASS}: one machine of {BIG_CORES} cores and {big_gib:.0f} GiB "
          f"({slots} slots by the default rule): {one_big / 60:.0f} min, limited by {why1}")
    print(f"  estimate, a class of {CLASS}: a Dask cluster of {MACHINES} such machines ({MACHINES * slots} "
          f"slots, the writer on the instructor's machine): {cluster / 60:.0f} min, limited by {why4}; "
          f"the writer alone takes {CLASS * m.write_seconds / 60:.0f} min (its floor); serial nbgrader "
          f"{CLASS * serial.seconds / n / 3600:.1f} h")
    dask = next((r for r in runs if r.how == "dask"), None)
    if dask is None:
        print("  check of the model against the 2-worker Dask run: not run (BENCH_CLASS_DASK=0)")
        return ok
    predicted, why = m.wall(n, 1, cores, 2, writer_shares_cores=True)
    met, off = verdict(predicted, dask.seconds)
    print(f"  check: the model predicts {predicted:.0f} s for the 2-worker Dask run (limited by {why}), "
          f"measured {dask.seconds:.0f} s, off by {100 * off:+.0f}% (tolerance {100 * DASK_TOLERANCE:.0f}%) -> "
          f"{'MET' if met else 'MISSED'}")
    return ok and met
