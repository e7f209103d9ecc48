"""Every platform choice of the pool, in one place (as torch's elastic launcher keeps
``IS_WINDOWS``/``IS_MACOS`` in one module). Each function takes the platform as an argument
(default: this one), so the macOS and Windows paths are unit-tested on Linux.

What differs, and what the pool does about it:

* Windows: no ``fork``, no process groups, no ``SIGKILL``: :func:`check_supported` refuses
  with advice (WSL2 runs the course as Linux does).
* Loopback interface for gloo (``GLOO_SOCKET_IFNAME``): ``lo`` on Linux, ``lo0`` on macOS.
* Ranks die with the caller: on every platform a watchdog thread in each rank ends the rank's
  process group when its control pipe from the caller closes (the caller exited or stopped
  the pool). Linux adds ``PR_SET_PDEATHSIG`` as a second line; macOS has no such call.
* Ranks cannot read each other: on Linux the fork server and every rank are non-dumpable
  (``PR_SET_DUMPABLE`` 0, :func:`make_non_dumpable`), so a process of the same user (another
  rank, a learner's code in it) can neither ptrace them nor read their ``/proc/<pid>/mem``,
  ``environ`` or ``fd`` (nor take a copy of a descriptor with ``pidfd_getfd``). Where a rank
  is stuck is still read as before: the pool signals it (``SIGUSR1``) and its own
  :mod:`faulthandler` writes its stack, which needs no access to its memory from outside.
  macOS has no such switch.
* Start method: ranks are forked from a server that imported torch once, *only while that
  server has a single thread* (checked before every fork), so no lock can be held by another
  thread at fork time: the reason Python made ``spawn`` the default on macOS. The server sets
  ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` to 1 before importing
  torch, because NumPy's OpenBLAS otherwise starts its thread pool at import. Should a
  platform's libraries start a thread anyway, each rank is started as a fresh interpreter
  (``exec``) instead: safe everywhere, at the cost of importing torch in every rank (about
  1 to 3 s of CPU per rank instead of about 0.02 s). ``HELPERS_SPAWN_START=exec`` forces it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["check_supported", "loopback_interface", "has_parent_death_signal",
           "install_parent_death_signal", "make_non_dumpable", "orphans_adopted_by_server", "start_method", "thread_count",
           "QUIET_THREAD_POOLS"]

#: Set in the fork server before it imports torch (and NumPy), so that no library starts a
#: thread pool there. Ranks get their own environment back before the function runs.
QUIET_THREAD_POOLS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def check_supported(platform: str = sys.platform) -> None:
    """Raise ``OSError`` with advice where the pool cannot run."""
    if platform.startswith("win") or platform == "cygwin":
        raise OSError(
            "helpers.spawn runs ranks as forked POSIX processes, which Windows does not have. "
            "Run the course under WSL2 (Windows Subsystem for Linux: `wsl --install`, then "
            "follow the README inside Ubuntu), where it works as on Linux."
        )


def loopback_interface(platform: str = sys.platform) -> str:
    """The name of the loopback network interface, for ``GLOO_SOCKET_IFNAME``."""
    return "lo0" if platform == "darwin" else "lo"


def has_parent_death_signal(platform: str = sys.platform,
                            environ: dict | None = None) -> bool:
    """Whether ranks also ask the kernel to kill them when their parent dies (Linux only).

    ``HELPERS_SPAWN_NO_PDEATHSIG=1`` turns it off, so a test can show that the watchdog alone
    is enough, as on macOS.
    """
    environ = os.environ if environ is None else environ
    return platform.startswith("linux") and environ.get("HELPERS_SPAWN_NO_PDEATHSIG") != "1"


def install_parent_death_signal(platform: str = sys.platform) -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where unavailable."""
    if not has_parent_death_signal(platform):
        return False
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):
        return False


def make_non_dumpable(platform: str = sys.platform) -> bool:
    """Make this process non-dumpable (Linux: ``prctl(PR_SET_DUMPABLE, 0)``), as the grading
    kernel makes itself: another process of the same user can then neither ptrace it nor open
    its ``/proc/<pid>/mem``, ``environ`` or ``fd``. Inherited by ``fork``, undone by ``exec``
    (a rank started as a fresh interpreter calls this again). False where unavailable."""
    if not platform.startswith("linux"):
        return False
    import ctypes

    try:
        PR_SET_DUMPABLE = 4
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def orphans_adopted_by_server(platform: str = sys.platform) -> bool:
    """Whether the fork server can be a child subreaper (Linux: ``PR_SET_CHILD_SUBREAPER``):
    then a process a rank started and left behind becomes the server's child when the rank
    dies, and stopping a pool needs no scan of the process table."""
    return platform.startswith("linux")


def start_method(threads: int, environ: dict | None = None) -> str:
    """``"fork"`` when a server with ``threads`` threads may fork ranks, else ``"exec"``."""
    environ = os.environ if environ is None else environ
    forced = environ.get("HELPERS_SPAWN_START", "")
    if forced not in ("", "fork", "exec"):
        raise ValueError(f"HELPERS_SPAWN_START must be 'fork' or 'exec', got {forced!r}.")
    if forced == "exec" or threads != 1:
        return "exec"
    return "fork"


def thread_count() -> int:
    """Threads of this process, native ones included (what matters when it forks)."""
    import psutil

    return psutil.Process().num_threads()
