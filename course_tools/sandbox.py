"""A sandbox around a grading kernel and everything it starts.

Made with bubblewrap (``bwrap``, Debian's ``bubblewrap`` package): the kernel sees a minimal
file system (the system's programs and libraries read-only, the course's Python environment
and ``helpers/`` read-only, nothing else of the course: no ``solutions/``, no other
submission, no gradebook), writes only in a private size-capped ``/tmp`` (a tmpfs of
``scratch_bytes``) and the folder of its own sockets, runs as an unprivileged user with no
capabilities, in its own PID namespace (ending the sandbox ends every process in it: a
double-forked daemon too) and its own network namespace (loopback only: gloo and the pool's
store work on 127.0.0.1 inside, nothing outside is reachable), with limits on file size, CPU
time and address space per process. ``bwrap`` itself starts with a scrubbed environment, so
nothing of the grader's (a hub token) is readable in the sandbox, not even in ``/proc/1/environ``.

Where ``bwrap`` is missing or cannot make namespaces, :func:`probe` says why and the grader
falls back to resource limits and killing the kernel's whole process tree (a child subreaper
catches daemons); the autograde log then says plainly that grading is not sandboxed.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Limits", "probe", "command", "remove_tree", "UNPRIVILEGED", "CLEAN_ENV"]

#: The user the sandboxed kernel runs as when grading runs as root (nobody).
UNPRIVILEGED = 65534
#: All the environment ``bwrap`` itself starts with (``env -i``): its own ``/proc/<pid>/environ``
#: is readable inside the sandbox when grading runs as an ordinary user.
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}


@dataclass
class Limits:
    """Per-process resource limits for the kernel and every process it starts."""

    processes: int | None = 256  # RLIMIT_NPROC, per user (None: the submission's pids cgroup counts)
    file_bytes: int = 512 * 2**20  # RLIMIT_FSIZE: no file larger than this
    cpu_seconds: int = 900  # RLIMIT_CPU, per process
    address_space: int = 16 * 2**30  # RLIMIT_AS, per process (torch reserves a lot of it)
    open_files: int = 1024  # RLIMIT_NOFILE

    def prlimit(self) -> list[str]:
        nproc = [] if self.processes is None else [f"--nproc={self.processes}"]
        return ["prlimit", *nproc, f"--fsize={self.file_bytes}",
                f"--cpu={self.cpu_seconds}", f"--as={self.address_space}",
                f"--nofile={self.open_files}", "--"]


def _system_dirs() -> list[str]:
    dirs = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]
    for prefix in {sys.base_prefix, sys.prefix, os.path.realpath(sys.executable).rsplit("/bin/", 1)[0]}:
        if not any(prefix == d or prefix.startswith(d + "/") for d in dirs):
            dirs.append(prefix)
    return [d for d in dirs if os.path.exists(d)]


@functools.lru_cache(maxsize=1)
def sized_tmpfs() -> bool:
    """Whether this bwrap can cap a tmpfs (``--size``, bubblewrap 0.8 and later)."""
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in out.stdout + out.stderr


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """``None`` if bubblewrap can sandbox here, else why not (said in the autograde log)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        out = subprocess.run(command(["true"], writable=None), capture_output=True, text=True,
                             timeout=30, env=CLEAN_ENV)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start ({e})"
    if out.returncode != 0:
        return f"bwrap cannot make namespaces here: {out.stderr.strip()[:200]}"
    return None


def command(cmd: list[str], writable: str | None, readable: list = (), env: dict | None = None,
            limits: Limits | None = None, cwd: str = "/tmp/work", rw: list = (),
            scratch_bytes: int | None = None, cgroup=None) -> list[str]:
    """``cmd`` wrapped in the sandbox. ``readable``: extra paths bound read-only, at the same
    place or as ``(host path, sandbox path)`` (the environment, ``helpers/``, the folder of the
    kernel's connection file); ``rw``: ``(host folder, sandbox path)`` bound writable (the
    kernel's sockets); ``writable``: a host folder bound as the sandbox's ``/tmp`` (``None``: a
    fresh tmpfs, of ``scratch_bytes`` if given and bwrap can size it), the only other place the
    sandbox can write; ``cwd`` (inside it) is read-only, so nothing can be planted where Python
    looks for modules. ``env`` is the whole environment of ``cmd``; ``bwrap`` itself gets only
    :data:`CLEAN_ENV`. ``cgroup``: a :class:`course_tools.budget.Group` the sandbox joins before
    it starts. The sandbox has its own network namespace: loopback only."""
    from course_tools.budget import join_command

    args = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-net", "--unshare-cgroup-try", "--dev", "/dev", "--proc", "/proc"]
    if os.geteuid() != 0:  # as root, setpriv below drops to an unprivileged user and every capability
        args += ["--cap-drop", "ALL"]
    # /tmp first: a bind below it (an environment or a course cloned under /tmp) must land on
    # the sandbox's own /tmp, not be hidden by it
    if writable is None:
        if scratch_bytes and sized_tmpfs():
            args += ["--size", str(scratch_bytes)]
        args += ["--perms", "1777", "--tmpfs", "/tmp"]
    else:
        args += ["--bind", writable, "/tmp"]
    binds = [(d, d, False) for d in _system_dirs()]
    binds += [(os.fspath(p[0]), os.fspath(p[1]), False) if isinstance(p, tuple) else (os.fspath(p),) * 2 + (False,)
              for p in readable]
    binds += [(os.fspath(src), os.fspath(dst), True) for src, dst in rw]
    targets = {dst for _, dst, _ in binds}
    parents = sorted({str(a) for _, dst, _ in binds for a in Path(dst).parents
                      if str(a) not in ("/", "/tmp")} - targets, key=lambda a: a.count("/"))
    for d in parents:  # made readable: bwrap would copy the host's modes (/root is 0700)
        args += ["--perms", "0755", "--dir", d]
    for src, dst, writes in binds:
        args += ["--bind" if writes else "--ro-bind", src, dst]
    # no resolver in the sandbox: names (the IPv4-mapped loopback the store's peers have) resolve here
    args += ["--hostname", "sandbox", "--ro-bind", str(Path(__file__).with_name("sandbox_hosts")), "/etc/hosts"]
    args += ["--perms", "0555", "--dir", cwd, "--chdir", cwd, "--clearenv"]
    for k, v in (env or {"PATH": "/usr/bin:/bin"}).items():
        args += ["--setenv", k, v]
    inner = list(cmd)
    if limits is not None:
        inner = limits.prlimit() + inner
    if os.geteuid() == 0:
        inner = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups",
                 "--"] + inner
    scrubbed = ["env", "-i"] + [f"{k}={v}" for k, v in CLEAN_ENV.items()]
    return scrubbed + join_command(cgroup, args + ["--"] + inner)


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything in it, whatever the modes the learner left (a folder of
    mode 000 cannot even be listed by its owner until it is given its modes back). Symbolic
    links are removed, never followed."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass
    for entry in os.scandir(path):
        remove_tree(entry.path)
    os.rmdir(path)


def main() -> int:
    """``python -m course_tools.sandbox``: say whether grading can be sandboxed here (exit 0 if so)."""
    from course_tools import budget

    group, no_budget = budget.create(budget.Budget())
    if group is not None:
        group.remove()
    print("each submission gets a cgroup budget" if no_budget is None
          else f"submissions get no cgroup budget here: {no_budget}")
    why = probe()
    if why is None:
        print("grading is sandboxed with bubblewrap" + ("" if sized_tmpfs() else
              " (this bwrap cannot size a tmpfs: /tmp is not capped)"))
        return 0
    print(f"grading cannot be sandboxed here: {why}\n"
          "install it with: sudo apt-get install bubblewrap (Debian, Ubuntu); without it grading "
          "falls back to resource limits and says so in the autograde log")
    return 1


if __name__ == "__main__":
    sys.exit(main())
