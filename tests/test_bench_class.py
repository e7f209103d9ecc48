"""The class bench (bench/class_grading.py, `make bench`): its model and report on given figures,
and a smoke run of the bench itself at its smallest (one submission, serial nbgrader and one
local worker, no Dask, no preflight), so that it cannot break unnoticed between measurements."""

from __future__ import annotations

import re

import pytest

from bench import class_grading as bench
from tests.class_course import make_class

M = bench.Model(startup=20.0, task_seconds=30.0, task_cpu=10.0, write_seconds=1.0, write_cpu=0.5)


def test_the_model_takes_the_tightest_limit():
    def rate(model, *args):
        r, why = model.rate(*args)
        return round(r, 4), why

    # 2 slots on 2 cores: the slots give 2/30 a second, the CPU 2/10.5, the writer 1/1
    assert rate(M, 1, 2, 2, True) == (round(2 / 30, 4), "the slots")
    # 16 slots on 16 cores: still the slots (16/30 a second, the CPU 16/10.5)
    assert rate(M, 1, 16, 16, True)[1] == "the slots"
    # 4 machines of 64 slots each: the writer's one submission a second binds
    assert rate(M, 4, 64, 64, False) == (1.0, "the writer")
    # slots that each need more CPU than their core gives: the CPU binds
    heavy = bench.Model(startup=0, task_seconds=10, task_cpu=20, write_seconds=0.1, write_cpu=0.1)
    assert rate(heavy, 1, 2, 2, True) == (round(2 / 20.1, 4), "the CPU")
    wall, why = M.wall(24, 1, 2, 2, True)
    assert wall == pytest.approx(20 + 24 * 15 + 1) and why == "the slots"


def test_the_model_s_inputs_come_from_the_one_worker_run():
    stats = {"startup_seconds": 20.0, "wall_seconds": 80.0, "submissions": {
        "a": {"seconds": 20.0, "cpu_seconds": 8.0, "cpu_exact": True, "write_seconds": 1.0, "write_cpu": 0.4},
        "b": {"seconds": 40.0, "cpu_seconds": 12.0, "cpu_exact": True, "write_seconds": 2.0, "write_cpu": 0.6},
        "c": {"seconds": 30.0, "cpu_seconds": None, "cpu_exact": None, "ok": False}}}  # cut at its bound
    m = bench.model_from(stats, wall=90.0)  # 10 s of the process's own start and exit
    assert m == bench.Model(startup=30.0, task_seconds=30.0, task_cpu=10.0, write_seconds=1.5, write_cpu=0.5)


def test_the_verdict_has_a_tolerance():
    met, off = bench.verdict(110, 100)
    assert met and off == pytest.approx(0.10)
    assert bench.verdict(70, 100)[0] is False
    assert bench.verdict(125, 100, tolerance=0.25)[0] is True


def test_the_default_slots_of_a_big_machine_follow_the_grader_s_rule():
    assert bench.slots_for(16, 64) == 16  # one per core
    assert bench.slots_for(16, 24) == 8  # 3 GiB a slot


def _runs(equal: bool, dask_seconds: float) -> tuple[list, dict]:
    stats = {"startup_seconds": 20.0, "submissions": {
        "a": {"seconds": 30.0, "cpu_seconds": 10.0, "cpu_exact": True, "write_seconds": 1.0, "write_cpu": 0.5},
        "b": {"seconds": 30.0, "cpu_seconds": 10.0, "cpu_exact": True, "write_seconds": 1.0, "write_cpu": 0.5}}}
    runs = [bench.Run("nbgrader autograde (serial)", None, 200.0, 30.0, True),
            bench.Run("course_tools.grade --workers 1", 1, 90.0, 40.0, True, stats),
            bench.Run("course_tools.grade --workers 2", 2, 60.0, 40.0, True),
            bench.Run("course_tools.grade on Dask, 2 workers", "dask", dask_seconds, 45.0, False)]
    same = {"a": {"t1": 1.0, "t2": 2.0}, "b": {"t1": 0.0, "t2": 2.0}}
    other = {"a": {"t1": 1.0, "t2": 0.0}, "b": same["b"]}
    return runs, {r.label: (same if equal or r.how != 2 else other) for r in runs}


def test_the_report_says_every_figure_and_verdict(capsys):
    runs, scores = _runs(equal=True, dask_seconds=57.0)
    assert bench.report(runs, scores, 2, 2, 64) is True
    out = capsys.readouterr().out
    print(out)
    assert re.search(r"nbgrader autograde \(serial\) +200 +0\.6 +15\.0 +1\.00x", out)
    assert re.search(r"course_tools.grade --workers 2 +60 +2\.0 +20\.0 +3\.33x", out)
    assert re.search(r"on Dask, 2 workers +57 +2\.1 +22\.5\+", out) and "(+: at least this much" in out
    assert "scores equal student by student in every run: yes" in out
    assert "best 3.33x (course_tools.grade --workers 2) -> MET" in out
    assert "a slot 30.0 s, 10.0 CPU-s; the writer 1.00 s (0.50 CPU-s), serial; start-up 20 s once" in out
    assert "estimate, a class of 1000: one machine of 16 cores and 64 GiB (16 slots by the default rule)" in out
    assert "a Dask cluster of 4 such machines (64 slots" in out and "the writer alone takes 17 min" in out
    # 20 + 2 * 30 / 2 + 1 = 51 s predicted, 57 measured: -11%, within 25%
    assert "the model predicts 51 s for the 2-worker Dask run (limited by the slots), measured 57 s, " \
           "off by -11% (tolerance 25%) -> MET" in out


def test_the_report_names_differing_scores_and_a_missed_check(capsys):
    runs, scores = _runs(equal=False, dask_seconds=100.0)
    assert bench.report(runs, scores, 2, 2, 64) is False
    out = capsys.readouterr().out
    assert "scores equal student by student in every run: NO" in out
    assert "course_tools.grade --workers 2: a differs from nbgrader autograde (serial) in t2 (2.0 vs 0.0)" in out
    assert "-> MISSED" in out.split("target:")[1].splitlines()[0]
    assert "off by -49% (tolerance 25%) -> MISSED" in out


def test_the_bench_runs_at_its_smallest(tmp_path, capsys):
    """The bench's own runs on the smallest class there is: one submission of the tests' tiny
    assignment (tests/class_course.py, preflight off), serial nbgrader and one local worker, no
    Dask: every process and figure of the real bench, in a minute or two. Its class of beginner
    submissions is built and checked too (without grading it)."""
    def tiny(folder):
        course = make_class(folder / "course", students=("s1",), extra_config="c.CourseExecute.preflight = False\n")
        return course, ["s1"], ["tiny"]

    assert bench.measure(tiny, "tiny", local=[1], with_dask=False) is True, "nothing can be missed here"
    out = capsys.readouterr().out
    print(out)
    serial = re.search(r"nbgrader autograde \(serial\) +\d+ +[\d.]+ +([\d.]+)\+? +1\.00x", out)
    one = re.search(r"course_tools.grade --workers 1 +\d+ +[\d.]+ +([\d.]+)\+? +[\d.]+x", out)
    assert serial and one, out
    assert float(serial[1]) > 2 and float(one[1]) > 2, "a submission costs seconds of CPU: kernel, ranks, imports"
    assert "scores equal student by student in every run: yes" in out
    assert "target: >= 1.8x over serial nbgrader: not measured" in out
    assert re.search(r"model \(from the 1-worker run, per submission\): a slot [\d.]+ s, [\d.]+ CPU-s", out)
    assert re.search(r"estimate, a class of 1000: one machine of 16 cores .* \d+ min, limited by", out)
    assert re.search(r"a Dask cluster of 4 such machines .* \d+ min, limited by", out)
    assert "check of the model against the 2-worker Dask run: not run (BENCH_CLASS_DASK=0)" in out

    course, students, notebooks = bench.make_class(tmp_path / "beginner", 6, preflight=False)
    assert students == ["right000", "wrong001", "right002", "right003", "wrong004", "hangs005"]
    assert notebooks == ["03_exercises"]
    assert "c.CourseExecute.preflight = False" in (course / "nbgrader_config.py").read_text()
    assert all((course / "submitted" / s / bench.DEPTH / "03_exercises.ipynb").exists() for s in students)
