"""One rank: what runs in each process the fork server starts.

``rank_main(spec)`` sets the process up (non-dumpable, its own process group, a watchdog, output pipes,
faulthandler on SIGUSR1, the caller's environment with torchrun's variables), joins the gloo
group, tells the caller it has joined, calls the function, sends back what it returned or
raised (:mod:`helpers._pool.messages`), then waits to be killed: a rank that has finished
stays alive, so a peer still blocked in a collective hangs as in a real job instead of
failing with "Connection closed by peer".
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from helpers._pool import messages, platform


def _watchdog(control_fd: int) -> None:
    """End this rank's process group once the caller's end of the control pipe closes.

    The caller holds the only write end: it closes when the pool stops or when the caller
    dies (a killed kernel), on every platform. Nothing is ever written on it.
    """
    while True:
        try:
            if not os.read(control_fd, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(1)


def _watch_syscalls(names: list[str], notify_fd: int) -> None:
    """Before anything the rank was given runs: if the caller watches system calls of this rank,
    install the seccomp filter (:mod:`helpers._pool.syscalls`) and hand its listener to the
    caller; then close the socket, so nothing later in this process can write on it."""
    import socket

    sock = socket.socket(fileno=notify_fd)
    try:
        if names:
            from helpers._pool import syscalls

            try:
                listener = syscalls.install(names)
            except OSError as e:
                sock.sendall(f"e{e}".encode()[:500])
            else:
                socket.send_fds(sock, [b"k"], [listener])
                os.close(listener)
    finally:
        sock.close()


def rank_main(spec: dict) -> None:
    """Entry point of one rank (forked by the server, or exec'ed where forking is unsafe)."""
    started = time.monotonic()
    platform.make_non_dumpable()  # forked: inherited already; exec'ed: before the job is read
    fds = spec["fds"]
    if os.getpgrp() != os.getpid():
        os.setpgrp()
    platform.install_parent_death_signal()
    if os.getppid() != spec["server_pid"]:  # the server died before the signal was armed
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Jupyter's interrupt is for the kernel
    threading.Thread(target=_watchdog, args=(fds["control"],), name="helpers.spawn watchdog",
                     daemon=True).start()

    _watch_syscalls(spec.get("syscalls") or [], fds["notify"])
    os.dup2(fds["out"], 1)
    os.dup2(fds["err"], 2)
    os.close(fds["out"])
    os.close(fds["err"])
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    import faulthandler

    stack_file = open(fds["stack"], "w", closefd=False)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=sys.stderr, all_threads=False)  # a segfault prints its stack
    result_fd = fds["result"]

    os.environ.clear()
    os.environ.update(spec["env"])
    os.environ.update(spec["layout_env"])
    sys.path[:] = spec["path"]
    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass

    import cloudpickle
    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec["threads"])
    dist.set_debug_level_from_env()

    t0 = time.monotonic()
    try:
        with open(spec["job"], "rb") as f:
            job = f.read()
        os.unlink(spec["job"])  # gone before any rank joins the group, so before any fn runs
        fn, args, kwargs = cloudpickle.loads(job)
        del job
        if spec["init"]:
            import datetime

            dist.init_process_group(
                "gloo", timeout=datetime.timedelta(seconds=spec["group_timeout"])
            )
        messages.send(result_fd, messages.Joined(time.monotonic() - started))
        t0 = time.monotonic()
        value = fn(*args, **kwargs)
        sys.stdout.flush()
        sys.stderr.flush()
        msg = result_message(value, spec["plain"], time.monotonic() - t0)
        del value
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        sys.stdout.flush()
        sys.stderr.flush()
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
        msg = messages.Raised(time.monotonic() - t0, type(e).__qualname__, str(e), tb)
    messages.send(result_fd, msg)
    del msg
    sys.stdout.flush()
    sys.stderr.flush()
    threading.Event().wait()  # until the pool kills this rank (or the watchdog does)


def result_message(value: Any, plain: bool, seconds: float) -> messages.Message:
    """``value`` serialised once with the pool's codec, or why it cannot be."""
    if plain:
        bad = messages.find_unplain(value)
        if bad is not None:
            where, type_name = bad
            inside = "" if where == "value" else f" (at {where.replace('value', 'the result', 1)})"
            return messages.Unsendable(seconds, type_name, f"is not plain data{inside}")
        dump = messages.dump_plain
    else:
        import cloudpickle

        dump = cloudpickle.dumps
    try:
        return messages.Returned(seconds, dump(value))
    except Exception as e:  # noqa: BLE001 - reported to the caller
        return messages.Unsendable(seconds, messages.type_name(value),
                                   f"cannot be serialised ({type(e).__name__}: {e})")
