"""A class graded: serial `nbgrader autograde` against `course_tools.grade` with 1, 2, 3 workers
and a Dask cluster of 2 workers, in the same run, on the same submissions.

The class: BENCH_CLASS submissions (default 24) of the beginner depth's exercises, half of them
the reference answers, a third wrong (every answer returns None), a sixth hanging (a barrier only
rank 0 reaches). Printed: wall time, throughput, CPU-s per submission (what
the grader's processes were charged once waited for: the sandboxed kernels and ranks are not all
counted), speed-up over serial nbgrader, and whether every student's scores are equal.
Target (issue 22): at least 1.8x over serial nbgrader with equal scores. From the CPU-s per
submission: what a 16-core grading machine and a 4-machine Dask cluster would take for a class of
1000, and the same estimate checked against the 2-worker Dask run.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from bench.grading import HANG
from course_tools import ROOT, venv_env
from course_tools.selfcheck import graded_notebooks
from course_tools.temp_course import fill, make_course, read_scores, reference_answers

DEPTH = "beginner"
WRONG = "return None"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def make_class(tmp: Path, n: int) -> tuple[Path, list[str], list[str]]:
    course = make_course(tmp, [DEPTH])
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


def timed(cmd, cwd, env=None) -> tuple[float, float]:
    cpu0, t0 = _cpu(), time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env or venv_env(), capture_output=True, text=True, timeout=7200)
    seconds, cpu = time.monotonic() - t0, _cpu() - cpu0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds, cpu


class Cluster:
    """`dask scheduler` and two `dask worker`s on 127.0.0.1, each in its own folder."""

    def __init__(self, folder: Path, workers: int = 2):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        dask = os.path.join(os.path.dirname(sys.executable), "dask")
        self.procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                        "--no-dashboard"], cwd=folder, env=venv_env(TMPDIR=str(folder)),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        for i in range(workers):
            wdir = folder / f"worker{i}"
            wdir.mkdir()
            self.procs.append(subprocess.Popen(
                [dask, "worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                 "--local-directory", str(wdir)], cwd=wdir, env=venv_env(TMPDIR=str(wdir)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()


def main() -> bool:
    n = int(os.environ.get("BENCH_CLASS", "24"))
    print(f"\nclass grading: {n} submissions of {DEPTH} (half right, a third wrong, a sixth hanging), "
          f"{len(os.sched_getaffinity(0))} cores")
    rows, scores = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        tmp = Path(tmp)
        base, students, notebooks = make_class(tmp / "base", n)
        runs = [("nbgrader autograde (serial)", None)] + [(f"course_tools.grade --workers {w}", w) for w in (1, 2, 3)] \
            + [("course_tools.grade on Dask, 2 workers", "dask")]
        for label, how in runs:
            course = tmp / f"run{len(rows)}"
            shutil.copytree(base, course)
            if how is None:
                seconds, cpu = timed([sys.executable, "-m", "nbgrader", "autograde", DEPTH, "--log-level=ERROR"],
                                     course)
            elif how == "dask":
                (tmp / "dask").mkdir()
                cluster = Cluster(tmp / "dask")
                try:
                    seconds, cpu = timed([sys.executable, "-m", "course_tools.grade", DEPTH, "--scheduler",
                                          cluster.address], course)
                finally:
                    cluster.close()
                cpu = None  # the workers' processes are not this run's children
            else:
                seconds, cpu = timed([sys.executable, "-m", "course_tools.grade", DEPTH, "--workers", str(how)], course)
            graded = read_scores(course, DEPTH, notebooks, students)
            scores[label] = {s: graded.scores[s] for s in students}
            rows.append((label, how, seconds, cpu))
            shutil.rmtree(course)
            print(f"  {label:<40} {seconds:7.0f} s", flush=True)
    serial = rows[0][2]
    equal = all(scores[label] == scores[rows[0][0]] for label, *_ in rows)
    print(f"\n  {'grader':<40} {'wall s':>7} {'per min':>8} {'CPU-s/sub':>10} {'speed-up':>9}")
    for label, how, seconds, cpu in rows:
        per = f"{cpu / n:10.1f}" if cpu is not None else f"{'-':>10}"
        print(f"  {label:<40} {seconds:7.0f} {60 * n / seconds:8.1f} {per} {serial / seconds:8.2f}x")
    best = max(serial / s for label, how, s, _ in rows if isinstance(how, int) and how > 1)
    ok = best >= 1.8 and equal
    print(f"  scores equal student by student in every run: {'yes' if equal else 'NO'}")
    for label, *_ in rows[1:]:
        for student in students:
            a, b = scores[rows[0][0]][student], scores[label][student]
            if a != b:
                differ = sorted(g for g in set(a) | set(b) if a.get(g) != b.get(g))
                print(f"    {label}: {student} differs from serial nbgrader in {', '.join(differ)}")
    print(f"  target: >= 1.8x over serial nbgrader with equal scores: best {best:.2f}x -> "
          f"{'MET' if ok else 'MISSED'}")
    one = next(r for r in rows if r[1] == 1)
    cpu_per = one[3] / n
    wall_per = one[2] / n
    for cores, machines in ((16, 1), (16, 4)):
        slots = cores * machines
        est = 1000 * max(cpu_per, wall_per) / slots
        print(f"  estimate, class of 1000 on {machines} machine(s) of {cores} cores, {cores} workers each: "
              f"{est / 60:.0f} min (1000 x max(CPU-s, 1-worker wall s) per submission / {slots} slots)")
    dask = next(r for r in rows if r[1] == "dask")
    predicted = n * max(cpu_per, wall_per) / 2
    print(f"  check: the same estimate for {n} submissions on 2 workers: {predicted:.0f} s; "
          f"the Dask run took {dask[2]:.0f} s")
    return ok
