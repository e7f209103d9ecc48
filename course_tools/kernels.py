"""How the course's own tools run a notebook unattended (the site build, `make course`, the test
suite): papermill, with a kernel client that notices a request the kernel never took up.

Why: with several notebook runs at once on a busy machine, a kernel now and then never started a
cell its client had sent. Reproduced with three small notebooks run at once, again and again: a
few rounds in twenty had one, with ipykernel 7.4 and 6.30, over TCP and over unix sockets; the
kernel sat idle, its debug log showed no ``execute_request``, and the client waited for the reply
until the cell's timeout (600 s in the site build). A kernel says ``busy`` as soon as it takes a
request up, so a request with no word from the kernel after :data:`ACK_TIMEOUT` seconds raises
:class:`KernelIgnoredRequest`, and :func:`execute_notebook` runs the notebook once more in a new
kernel (saying so on stderr). A cell that is slow or hangs is not affected: its kernel said
``busy`` when it started it. tests/test_kernels.py drops a request in a real kernel to check both.
"""

from __future__ import annotations

import asyncio
import sys
import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

#: Seconds a kernel has to take up a request (publish anything about it) before the run is given up.
ACK_TIMEOUT = 60.0


class KernelIgnoredRequest(RuntimeError):
    """The kernel never took up a request it was sent."""


class AckWatchingClient(AsyncKernelClient):
    """An ``AsyncKernelClient`` whose shell channel raises :class:`KernelIgnoredRequest` while it
    waits for a reply, once a request sent by :meth:`execute` has had no message about it (on
    iopub or shell) for :data:`ACK_TIMEOUT` seconds."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._unacked: dict[str, float] = {}  # msg_id -> when it must have been taken up

    def execute(self, *args, **kwargs) -> str:
        msg_id = super().execute(*args, **kwargs)
        self._unacked[msg_id] = time.monotonic() + ACK_TIMEOUT
        return msg_id

    def _heard(self, msg: dict) -> dict:
        self._unacked.pop(msg.get("parent_header", {}).get("msg_id"), None)
        return msg

    @staticmethod
    def _watched(channel, wrap):
        """``channel`` with its ``get_msg`` replaced by ``wrap(get_msg)``, once."""
        if not getattr(channel, "_course_watched", False):
            channel.get_msg, channel._course_watched = wrap(channel.get_msg), True
        return channel

    @property
    def iopub_channel(self):
        def wrap(get):
            async def get_msg(timeout=None):
                return self._heard(await get(timeout=timeout))
            return get_msg

        return self._watched(super().iopub_channel, wrap)

    @property
    def shell_channel(self):
        def wrap(get):
            async def get_msg(timeout=None):
                end = None if timeout is None else time.monotonic() + timeout
                while True:
                    now = time.monotonic()
                    first = min(self._unacked.values(), default=None)
                    wait = [t - now for t in (end, first) if t is not None]
                    try:
                        return self._heard(await get(timeout=max(0.0, min(wait)) if wait else None))
                    except Empty:
                        if end is not None and time.monotonic() >= end:
                            raise
                        late = [m for m, t in self._unacked.items() if time.monotonic() >= t]
                        if late:
                            # nbclient stops its kernel-alive poll only when a reply or a
                            # timeout ends the cell: stop it here, or it fails once the
                            # kernel is gone ("Task exception was never retrieved")
                            for task in asyncio.all_tasks():
                                if task.get_coro().__name__ == "_async_poll_kernel_alive":
                                    task.cancel()
                            raise KernelIgnoredRequest(
                                f"the kernel never took up request {late[0]} "
                                f"(no word about it in {ACK_TIMEOUT:.0f} s)") from None
            return get_msg

        return self._watched(super().shell_channel, wrap)


class WatchedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose clients are :class:`AckWatchingClient`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.client_factory = AckWatchingClient


def execute_notebook(source: str, output: str, **kwargs):
    """``papermill.execute_notebook`` with :class:`WatchedKernelManager`; run once more, in a new
    kernel, if the kernel never took up a cell (:class:`KernelIgnoredRequest`)."""
    import papermill as pm

    kwargs.setdefault("kernel_manager_class", WatchedKernelManager)
    try:
        return pm.execute_notebook(source, output, **kwargs)
    except KernelIgnoredRequest as e:
        print(f"{source}: {e}; running it again in a new kernel", file=sys.stderr, flush=True)
        return pm.execute_notebook(source, output, **kwargs)
