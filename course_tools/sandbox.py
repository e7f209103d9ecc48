"""A sandbox around a grading kernel and everything it starts.

Made with bubblewrap (``bwrap``, Debian's ``bubblewrap`` package): the kernel sees a minimal
file system (the system's programs and libraries read-only, the course's Python environment
and ``helpers/`` read-only, nothing else of the course: no ``solutions/``, no other
submission, no gradebook), writes only in a private temporary folder, runs as an
unprivileged user with no capabilities, in its own PID namespace (ending the sandbox ends every
process in it: a double-forked daemon too), with limits on processes, file size, CPU time and
address space.

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

__all__ = ["Limits", "probe", "command", "UNPRIVILEGED"]

#: The user the sandboxed kernel runs as when grading runs as root (nobody).
UNPRIVILEGED = 65534


@dataclass
class Limits:
    """Per-process resource limits for the kernel and every process it starts."""

    processes: int = 256  # RLIMIT_NPROC, for the unprivileged user (a fork bomb stops here)
    file_bytes: int = 512 * 2**20  # RLIMIT_FSIZE: no file larger than this
    cpu_seconds: int = 900  # RLIMIT_CPU, per process
    address_space: int = 16 * 2**30  # RLIMIT_AS, per process (torch reserves a lot of it)
    open_files: int = 1024  # RLIMIT_NOFILE

    def prlimit(self) -> list[str]:
        return ["prlimit", f"--nproc={self.processes}", f"--fsize={self.file_bytes}",
                f"--cpu={self.cpu_seconds}", f"--as={self.address_space}",
                f"--nofile={self.open_files}", "--"]


def _system_dirs() -> list[str]:
    dirs = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]
    for prefix in {sys.base_prefix, sys.prefix, os.path.realpath(sys.executable).rsplit("/bin/", 1)[0]}:
        if not any(prefix == d or prefix.startswith(d + "/") for d in dirs):
            dirs.append(prefix)
    return [d for d in dirs if os.path.exists(d)]


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """``None`` if bubblewrap can sandbox here, else why not (said in the autograde log)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        out = subprocess.run(command(["true"], writable=None), capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start ({e})"
    if out.returncode != 0:
        return f"bwrap cannot make namespaces here: {out.stderr.strip()[:200]}"
    return None


def command(cmd: list[str], writable: str | None, readable: list = (), env: dict | None = None,
            limits: Limits | None = None, cwd: str = "/tmp/work") -> list[str]:
    """``cmd`` wrapped in the sandbox. ``readable``: extra paths bound read-only, at the same
    place or as ``(host path, sandbox path)`` (the environment, ``helpers/``, the kernel's
    connection file); ``writable``: a host folder bound as the sandbox's ``/tmp`` (``None``: a
    fresh tmpfs), the only place the sandbox can write; ``cwd`` (inside it) is read-only, so
    nothing can be planted where Python looks for modules. ``env`` is the whole environment."""
    args = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--dev", "/dev", "--proc", "/proc"]
    if os.geteuid() != 0:  # as root, setpriv below drops to an unprivileged user and every capability
        args += ["--cap-drop", "ALL"]
    binds = [(d, d) for d in _system_dirs()]
    binds += [(os.fspath(p[0]), os.fspath(p[1])) if isinstance(p, tuple) else (os.fspath(p),) * 2
              for p in readable]
    targets = {dst for _, dst in binds}
    parents = sorted({str(a) for _, dst in binds for a in Path(dst).parents
                      if str(a) not in ("/", "/tmp")} - targets, key=lambda a: a.count("/"))
    for d in parents:  # made readable: bwrap would copy the host's modes (/root is 0700)
        args += ["--perms", "0755", "--dir", d]
    for src, dst in binds:
        args += ["--ro-bind", src, dst]
    if writable is None:
        args += ["--perms", "1777", "--tmpfs", "/tmp"]
    else:
        args += ["--bind", writable, "/tmp"]
    args += ["--perms", "0555", "--dir", cwd, "--chdir", cwd, "--clearenv"]
    for k, v in (env or {"PATH": "/usr/bin:/bin"}).items():
        args += ["--setenv", k, v]
    inner = list(cmd)
    if limits is not None:
        inner = limits.prlimit() + inner
    if os.geteuid() == 0:
        inner = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups",
                 "--"] + inner
    return args + ["--"] + inner


def main() -> int:
    """``python -m course_tools.sandbox``: say whether grading can be sandboxed here (exit 0 if so)."""
    why = probe()
    if why is None:
        print("grading is sandboxed with bubblewrap")
        return 0
    print(f"grading cannot be sandboxed here: {why}\n"
          "install it with: sudo apt-get install bubblewrap (Debian, Ubuntu); without it grading "
          "falls back to resource limits and says so in the autograde log")
    return 1


if __name__ == "__main__":
    sys.exit(main())
