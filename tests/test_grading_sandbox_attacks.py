"""The sandbox's walls, budgets and preflight against a determined learner (issue 21, points 2, 5, 6).

One real ``nbgrader autograde`` grades a class of the beginner exercises under small budgets
(memory, processes, scratch): a rank that hunts for the grading kernel's key, sockets and the
host's network; ranks that together allocate past the memory budget; a fork bomb; files past
the scratch cap; honest classmates sorted first and last. Then the sandbox's own command run as
an ordinary user, a cgroup made and removed, and a misconfigured course that must stop before
grading anyone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
from pathlib import Path

import nbformat
import pytest

from course_tools import ROOT, nbgrader
from course_tools import budget as budgets
from course_tools.sandbox import probe
from course_tools.temp_course import make_course, read_scores, reference_answers, submit
from tests.grading_runs import NOTEBOOKS
from tests.nbgrade import cell_output, grading_bound

pytestmark = pytest.mark.grading

SOURCE = NOTEBOOKS["beginner"]
SAVE = {"test_save_once_only_rank0_writes", "test_save_once_everyone_waits"}
AVERAGE = {"test_combined_average_same_on_every_worker", "test_combined_average_unequal_counts"}
# Small budgets, so that exceeding them is cheap; the honest classmates must fit in them too.
BUDGET = {"budget_memory_bytes": 1536 * 2**20, "budget_processes": 256, "scratch_bytes": 256 * 2**20}

SPY = textwrap.dedent('''
    def save_once(obj, path):
        """From a rank: look for the grading kernel's key and sockets, and for the host's network."""
        import ctypes, glob, os, re, socket
        import torch.distributed as dist
        if dist.get_rank() != 0:
            return
        key = re.compile(rb"[0-9a-f]{{8}}-[0-9a-f]{{24}}")  # how jupyter_client makes a kernel's key
        got = {{}}
        def probe(what, read):
            try:
                got[what] = "KEY" if key.search(read()) else "nokey"
            except Exception as e:
                got[what] = type(e).__name__
        def reach(what, family, address):
            s = socket.socket(family)
            s.settimeout(3)
            try:
                s.connect(address)
                got[what] = "CONNECTED"
            except OSError as e:
                got[what] = type(e).__name__
        server = os.getppid()
        kernel = int(open(f"/proc/{{server}}/stat").read().rsplit(")", 1)[1].split()[1])
        argv = open(f"/proc/{{kernel}}/cmdline", "rb").read().split(b"\\0")
        conn = argv[argv.index(b"-f") + 1].decode()
        probe("conn", lambda: open(conn, "rb").read())
        for name in ("environ", "mem", "cmdline"):
            probe(f"kernel_{{name}}", lambda: open(f"/proc/{{kernel}}/{{name}}", "rb").read(1 << 20))
            probe(f"pid1_{{name}}", lambda: open(f"/proc/1/{{name}}", "rb").read(1 << 20))
        probe("kernel_fd", lambda: " ".join(os.listdir(f"/proc/{{kernel}}/fd")).encode())
        libc = ctypes.CDLL(None, use_errno=True)
        got["ptrace"] = "ATTACHED" if libc.ptrace(16, kernel, 0, 0) == 0 else "refused"
        # the pool's fork server and the other ranks: their memory, environ, descriptors, ptrace, and a
        # copy of the server's socket to the kernel (pidfd_getfd) or a write on a peer's pipe
        me = os.getpid()
        peer = next(int(p) for p in open(f"/proc/{{server}}/task/{{server}}/children").read().split() if int(p) != me)
        libc.syscall.restype = ctypes.c_long
        sock_fd = int(open(f"/proc/{{server}}/cmdline", "rb").read().split(b"\\0")[-2])
        def tries(*attempts):
            out = []
            for attempt in attempts:
                try:
                    out.append(attempt() or "no")
                except PermissionError:
                    out.append("no")
                except Exception as e:
                    out.append(type(e).__name__)
            return "/".join(out)
        for who, pid, last in (("server", server, lambda: "STOLEN" if libc.syscall(438, os.pidfd_open(server), sock_fd, 0) >= 0 else None),
                               ("peer", peer, lambda: open(f"/proc/{{peer}}/fd/1", "w").write("forged\\n") and "WROTE")):
            got[who] = tries(lambda: open(f"/proc/{{pid}}/mem", "rb") and "READ",
                             lambda: open(f"/proc/{{pid}}/environ", "rb").read(1) and "READ",
                             lambda: os.listdir(f"/proc/{{pid}}/fd") and "READ",
                             lambda: "ATTACHED" if libc.ptrace(16, pid, 0, 0) == 0 else None, last)
        names = sorted(p for d in {{os.path.dirname(conn), "/run/kernel", "/run/key"}} for p in glob.glob(d + "/*"))
        got["socket_names"] = len(names)
        for i, p in enumerate(names):
            reach(f"socket{{i}}", socket.AF_UNIX, p)
        reach("host_tcp", socket.AF_INET, ("127.0.0.1", {port}))
        reach("host_abstract", socket.AF_UNIX, "\\0{abstract}")
        mine = socket.create_server(("127.0.0.1", 0))  # the controls: loopback works inside,
        reach("own_loopback", socket.AF_INET, mine.getsockname())
        probe("peer_cmdline", lambda: open(f"/proc/{{peer}}/cmdline", "rb").read())  # and so does reading /proc
        raise RuntimeError("SPY " + " ".join(f"{{k}}={{v}}" for k, v in got.items()))
''')

HOG = textwrap.dedent('''
    def save_once(obj, path):
        """Every rank holds 700 MB: each is far below the per-process limit, together past the budget."""
        import torch.distributed as dist
        blob = b"x" * (700 << 20)
        dist.barrier()
        dist.barrier()
        return len(blob)
''')

BOMB = textwrap.dedent('''
    def save_once(obj, path):
        """A fork bomb: a shell on every rank starts processes without end (each holds its place 3 s)."""
        import subprocess
        subprocess.run(["sh", "-c", "while :; do sleep 3 & done"], capture_output=True)
''')

FILL = textwrap.dedent('''
    def save_once(obj, path):
        """Fill the scratch folder: 400 MB of files in /tmp."""
        import os, tempfile
        import torch.distributed as dist
        if dist.get_rank() == 0:
            chunk = b"x" * (1 << 20)
            with open(os.path.join(tempfile.gettempdir(), "fill.bin"), "wb") as f:
                for _ in range(400):
                    f.write(chunk)
        dist.barrier()
''')


class Listener:
    """A TCP server on the host's 127.0.0.1 and an abstract unix socket, counting who connects."""

    def __init__(self):
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.abstract_name = f"course-test-{os.getpid()}-{id(self)}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.abstract_name)
        self.unix.listen()
        self.accepted = []
        self.threads = [threading.Thread(target=self._accept, args=(s,), daemon=True)
                        for s in (self.tcp, self.unix)]
        for t in self.threads:
            t.start()

    @property
    def port(self) -> int:
        return self.tcp.getsockname()[1]

    def _accept(self, sock):
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            self.accepted.append(sock.family)
            conn.close()

    def close(self):
        for s in (self.tcp, self.unix):
            s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self.threads:
            t.join()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    listener = Listener()
    tmp = tmp_path_factory.mktemp("sandbox-attacks")
    course = make_course(tmp, ["beginner"])
    with open(course / "nbgrader_config.py", "a") as f:
        f.writelines(f"c.CourseExecute.{k} = {v}\n" for k, v in BUDGET.items())
    reference = reference_answers(SOURCE)
    students = {
        "aa_honest": reference,
        "bomb": {"save_once": BOMB, "combined_average": reference["combined_average"]},
        "fill": {"save_once": FILL, "combined_average": reference["combined_average"]},
        "hog": {"save_once": HOG, "combined_average": reference["combined_average"]},
        "spy": {"save_once": SPY.format(port=listener.port, abstract=listener.abstract_name),
                "combined_average": "def combined_average(loss, count):\n    pass\n"},
        "zz_honest": reference,
    }
    for student, answers in students.items():
        submit(course, student, "beginner", SOURCE.name, answers)
    bystander = subprocess.Popen(["sleep", "600.201"])  # a process of the host's, beside grading
    try:
        proc = nbgrader("autograde", "beginner", "--force", cwd=course, check=False, log_level="INFO",
                        timeout=grading_bound([SOURCE], len(students) + 1))
        bystander_alive = bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        listener.close()
    return {"graded": read_scores(course, "beginner", SOURCE.stem, list(students)), "course": course,
            "log": proc.stdout + proc.stderr, "code": proc.returncode, "accepted": listener.accepted,
            "bystander_alive": bystander_alive}


def _lost(graded, student) -> set[str]:
    return graded["graded"].lost(student) & (SAVE | AVERAGE)


def _said(graded, student, grade_id) -> str:
    return cell_output(graded["graded"].notebook(student, SOURCE.stem), grade_id)


def test_the_run_is_sandboxed_with_budgets_and_preflight(graded):
    assert probe() is None, probe()
    assert graded["code"] == 0, graded["log"][-3000:]
    assert "NOT sandboxed" not in graded["log"] and "NO per-submission budget" not in graded["log"]
    assert re.search(r"Preflight passed in \d+\.\d s", graded["log"]), graded["log"][-3000:]


@pytest.mark.parametrize("student", ["aa_honest", "zz_honest"])
def test_honest_classmates_keep_full_marks_under_the_budget(graded, student):
    g = graded["graded"]
    assert g.lost(student) == set(), g.shown(student, g.lost(student))


def test_a_rank_finds_no_key_no_kernel_socket_and_no_host_network(graded):
    assert graded["graded"].total("spy") == 0, graded["graded"].scores["spy"]
    text = _said(graded, "spy", "test_save_once_only_rank0_writes")
    said = dict(kv.split("=", 1) for kv in re.search(r"SPY (.*)", text).group(1).split())
    assert said["own_loopback"] == "CONNECTED" and said["peer_cmdline"] == "nokey", text  # the probe works
    assert said["conn"] == "FileNotFoundError", text  # the key file is gone
    for what in ("kernel_environ", "kernel_mem", "kernel_fd"):
        assert said[what] == "PermissionError", text  # the kernel is non-dumpable
    assert said["kernel_cmdline"] == "nokey" and said["ptrace"] == "refused", text
    assert said["pid1_environ"] != "KEY" and said["pid1_mem"] != "KEY", text
    assert said["socket_names"] == "0", text  # the kernel's sockets have no names left
    assert said["host_tcp"] == "ConnectionRefusedError", text  # another network namespace
    assert said["host_abstract"] == "ConnectionRefusedError", text
    assert "KEY" not in said.values() and "CONNECTED" not in {v for k, v in said.items() if k != "own_loopback"}, text
    # the pool's fork server and the other ranks are non-dumpable too: no rank reads their memory,
    # environ or descriptors, ptraces them, writes on a peer's pipe or copies the server's socket
    assert said["server"] == said["peer"] == "no/no/no/no/no", text
    assert graded["accepted"] == [], "a connection from the sandbox reached the host"


def test_ranks_past_the_memory_budget_fail_with_the_budget_named_and_nothing_else_dies(graded):
    assert _lost(graded, "hog") == SAVE, graded["graded"].shown("hog", _lost(graded, "hog"))
    text = _said(graded, "hog", "test_save_once_only_rank0_writes")
    assert "the submission's memory budget of 1.5 GiB was exceeded" in text, text
    assert graded["bystander_alive"]


def test_a_fork_bomb_stops_at_the_process_budget(graded):
    assert _lost(graded, "bomb") == SAVE, graded["graded"].shown("bomb", _lost(graded, "bomb"))
    text = _said(graded, "bomb", "test_save_once_only_rank0_writes")
    assert "No worker called torch.save" in text, text  # graded as usual, no hang, no crash
    assert "the submission's process budget of 256 processes and threads was reached" in text, text


def test_files_past_the_scratch_cap_fail_with_a_clear_message(graded):
    # the filler stays in the submission's own /tmp, so its later tests that write there (the
    # average checks hand each rank its inputs in a file) fail too, each naming the budget
    assert _lost(graded, "fill") == SAVE | AVERAGE, graded["graded"].shown("fill", _lost(graded, "fill"))
    text = _said(graded, "fill", "test_save_once_only_rank0_writes")
    assert "No space left on device" in text, text
    for test in SAVE | AVERAGE:
        text = _said(graded, "fill", test)
        assert "the submission's scratch space of 256 MiB (its /tmp" in text, (test, text)


def test_the_budget_and_preflight_settings_have_help():
    from course_tools.autograde import CourseExecute

    for name in ("budget", "budget_memory_bytes", "budget_processes", "budget_cpu_weight", "budget_cpus",
                 "scratch_bytes", "preflight"):
        trait = CourseExecute.class_traits()[name]
        assert trait.metadata.get("config") and len(trait.help) > 40, name


# ----------------------------------------------------------------------------- one cgroup


def test_a_budget_group_counts_its_processes_and_leaves_nothing():
    group, why = budgets.create(budgets.Budget(memory_bytes=300 * 2**20, processes=64, cpu_weight=50))
    assert group is not None, why
    folders = {d for _, d in group.folders.values()}
    try:
        assert set(group.folders) == {"memory", "pids", "cpu"}
        limits = {c: (v, d) for c, (v, d) in group.folders.items()}
        v, d = limits["memory"]
        assert Path(d, "memory.limit_in_bytes" if v == "v1" else "memory.max").read_text().strip() == str(300 * 2**20)
        assert Path(limits["pids"][1], "pids.max").read_text().strip() == "64"
        v, d = limits["cpu"]
        assert Path(d, "cpu.shares" if v == "v1" else "cpu.weight").read_text().strip() == ("512" if v == "v1" else "50")
        # a process past the memory budget is killed, and the group says so
        out = subprocess.run(budgets.join_command(group, ["python3", "-c", "b = b'x' * (600 << 20)"]))
        assert out.returncode == -9 and group.oom_kills() == 1
        # its CPU time, counted by the group, as much as the process was charged
        spin = subprocess.run(budgets.join_command(group, ["python3", "-c", "import time\nt = time.process_time()\n"
                                                           "while time.process_time() - t < 0.5: pass"]))
        assert spin.returncode == 0 and group.cpu_seconds() >= 0.5, group.cpu_seconds()
        sleeper = subprocess.Popen(budgets.join_command(group, ["sleep", "600.202"]))
        try:
            assert sleeper.pid in group.pids() or _wait_member(group, sleeper.pid)
        finally:
            assert group.remove()
        assert sleeper.wait(timeout=10) == -9
        assert group.cpu_used >= 0.5, "read when the group was removed"
    finally:
        group.remove()
    assert not any(os.path.exists(d) for d in folders | {d for _, d in group.accounting.values()})


def _wait_member(group, pid) -> bool:
    """The shell joins the group before it execs: wait until it has (bounded, no sleep)."""
    import select

    for _ in range(1000):
        if pid in group.pids():
            return True
        select.select([], [], [], 0.01)
    return False


def test_paths_under_tmp_are_seen_inside_the_sandbox(tmp_path):
    """A course or environment cloned under /tmp (its binds land on the sandbox's own /tmp, with
    a fresh tmpfs there and with a host folder bound as /tmp): the files are read inside, and the
    sandbox's /tmp is still the one place it writes."""
    from course_tools import sandbox

    assert str(tmp_path).startswith("/tmp/"), tmp_path
    course = tmp_path / "course"
    course.mkdir()
    (course / "lesson.txt").write_text("seen inside\n")
    course.chmod(0o755)
    tmp_path.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o777)
    inner = f"cat {course}/lesson.txt && echo made > /tmp/new && cat /tmp/new"
    for writable in (None, str(scratch)):
        out = subprocess.run(sandbox.command(["/bin/sh", "-c", inner], writable=writable,
                                             readable=[course]),
                             capture_output=True, text=True, timeout=60, env=sandbox.CLEAN_ENV)
        assert out.returncode == 0 and out.stdout.split("\n")[:2] == ["seen inside", "made"], \
            (writable, out.stdout, out.stderr)
    assert (scratch / "new").read_text() == "made\n"


# ----------------------------------------------------------------------------- as an ordinary user


USER_SCRIPT = textwrap.dedent('''
    import os, subprocess, sys
    sys.path.insert(0, sys.argv[1])
    from course_tools import sandbox, budget
    scratch = sys.argv[2]
    inner = ("tr '\\\\0' '\\\\n' < /proc/1/environ; echo ---; mkdir -p /tmp/locked/deeper; "
             "echo x > /tmp/locked/deeper/file; chmod 000 /tmp/locked/deeper /tmp/locked")
    cmd = sandbox.command(["/bin/sh", "-c", inner], writable=scratch)
    out = subprocess.run(cmd, capture_output=True, text=True)
    print(out.stdout, out.stderr, "exit", out.returncode)
    print("left before cleanup:", os.path.exists(os.path.join(scratch, "locked")))
    sandbox.remove_tree(scratch)
    print("left after cleanup:", os.path.exists(scratch))
    group, why = budget.create(budget.Budget())
    print("budget:", why)
''')


def test_as_an_ordinary_user_the_sandbox_holds_none_of_the_grader_s_environment_and_leaves_nothing():
    """The grader run as nobody (uid 65534), with the system's Python (the course's .venv here is
    under /root, which other users cannot read): bwrap's own /proc/1/environ inside holds only
    PATH, a mode-000 folder the learner left is removed, and no cgroup can be made (said why)."""
    top = tempfile.mkdtemp(prefix="course-nonroot-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        os.chown(top, 65534, 65534)  # the grader's own temporary folder
        scratch = os.path.join(top, "scratch")
        os.mkdir(scratch)
        os.chown(scratch, 65534, 65534)
        env = {"PATH": "/usr/bin:/bin", "HUB_API_TOKEN": "hub-secret-token-123", "HOME": "/nonexistent"}
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              shutil.which("python3", path="/usr/bin"), "-c", USER_SCRIPT, str(ROOT), scratch],
                             capture_output=True, text=True, env=env, cwd=top, timeout=120)
        text = out.stdout + out.stderr
        assert out.returncode == 0 and "exit 0" in text, text
        environ = text.split("---")[0].split()
        assert environ == ["PATH=/usr/bin:/bin"], text
        assert "hub-secret-token-123" not in text
        assert "left before cleanup: True" in text and "left after cleanup: False" in text, text
        assert re.search(r"budget: (cannot make a cgroup|cannot enable|no cgroup).*", text), text
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ----------------------------------------------------------------------------- preflight


def test_a_course_whose_environment_imports_another_helpers_stops_before_grading_anyone(tmp_path):
    """A copy of the course (its own course_tools/ and helpers/) graded with this environment,
    whose editable install imports helpers from this checkout: the sandbox shows the copy's
    helpers, the kernel cannot import any. Autograde stops with the cause and the fix."""
    copy = tmp_path / "copy"
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for part in ("course_tools", "helpers"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    shutil.copytree(ROOT / "solutions" / "beginner", copy / "solutions" / "beginner", ignore=ignore)
    shutil.copy(ROOT / "nbgrader_config.py", copy / "nbgrader_config.py")
    nbgrader("generate_assignment", "beginner", "--force", cwd=copy)
    for student in ("alice", "bob"):
        submit(copy, student, "beginner", SOURCE.name, reference_answers(SOURCE))
    proc = nbgrader("autograde", "beginner", "--force", cwd=copy, check=False, log_level="INFO",
                    timeout=grading_bound([SOURCE], 2))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert "Autograde stopped before grading anyone (preflight" in log, log[-3000:]
    assert "the grading sandbox cannot import helpers" in log, log[-3000:]
    assert f"imports helpers from {ROOT / 'helpers'}" in log, log[-3000:]
    assert f"pip install --no-deps -e {copy}" in log, log[-3000:]
    assert "Autograding" not in log.split("Autograde stopped")[1]  # bob was never started
    from nbgrader.api import Gradebook, Grade

    with Gradebook(f"sqlite:///{copy}/gradebook.db") as gb:
        scores = [g.auto_score for g in gb.db.query(Grade).all()]
    assert all(s is None for s in scores), scores  # no zeros written
    assert not list(copy.glob("autograded/**/*.ipynb"))  # nothing half-written either
