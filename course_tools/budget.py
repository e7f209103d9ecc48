"""A budget per submission: one cgroup holds every process a submission's grading kernel starts.

Per-process limits (``RLIMIT_AS``, ``RLIMIT_NPROC``) do not add up: 256 processes of 16 GB each
exhaust any machine. A cgroup counts the whole submission: its memory (``memory.max`` on cgroup
v2, ``memory.limit_in_bytes`` on v1), its processes and threads (``pids.max``), and its share of
the CPU against everything else on the host (``cpu.weight`` / ``cpu.shares``, and optionally a
quota in cores, ``cpu.max`` / ``cpu.cfs_quota_us``). When the memory budget is exceeded the
kernel's OOM killer kills a process *of that cgroup*, never another submission's or the hub's.

Where the cgroups are made (say so if your host differs):

* cgroup v1 (a hierarchy per controller, ``/sys/fs/cgroup/<controller>``): a child of this
  process's own cgroup in each hierarchy (read from ``/proc/self/cgroup``).
* cgroup v2 (``/sys/fs/cgroup``, or the ``cgroup2`` mount found in ``/proc/self/mountinfo``): a
  child of this process's own cgroup if its ``cgroup.subtree_control`` can enable the
  controllers (a delegated subtree), else a child of the hierarchy's root (root only).

A process joins the group before it runs anything (``join_command``: a shell writes its own pid
into ``cgroup.procs`` and then execs the sandbox), so everything it starts is counted.
Stdlib only: a grader without the course's environment can use it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field

__all__ = ["Budget", "Group", "create", "join_command", "gib"]

CONTROLLERS = ("memory", "pids", "cpu")
#: Controllers the group joins for accounting only, where they are a hierarchy of their own (cgroup
#: v1's ``cpuacct``, when it is not mounted with ``cpu``): the group's exact CPU time
#: (:meth:`Group.cpu_seconds`). On cgroup v2 the ``cpu`` folder's ``cpu.stat`` holds it.
ACCOUNTING = ("cpuacct",)


def gib(n: int) -> str:
    """Bytes as the budget messages say them: '1.5 GiB', '256 MiB'."""
    if n >= 2**30:
        return f"{n / 2**30:.3g} GiB"
    return f"{n / 2**20:.3g} MiB"


@dataclass(frozen=True)
class Budget:
    """What one submission may use, all its processes together."""

    memory_bytes: int = 4 * 2**30
    processes: int = 512  # tasks: processes and threads (torch starts a few threads per rank)
    cpu_weight: int = 100  # relative share, cgroup v2 scale (v1: cpu.shares = weight * 1024 / 100)
    cpus: float = 0.0  # a quota in cores (0: none; the weight alone shares the CPU fairly)


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _mounts() -> list[tuple[str, str, str, set]]:
    """(fstype, mount point, mount root, super options) of every cgroup mount."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                    out.append((rest[0], _unescape(fields[4]), _unescape(fields[3]), set(rest[2].split(","))))
    except OSError:
        pass
    return out


def _own_cgroups() -> dict[str, str]:
    """Controller (v1) or '' (v2) -> this process's cgroup path in that hierarchy."""
    own = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    own[c] = path
    except OSError:
        pass
    return own


def _below(mount: str, root: str, path: str) -> str:
    """The folder of cgroup ``path`` in a hierarchy mounted at ``mount`` (its root: ``root``)."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.join(mount, path.lstrip("/"))


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


def _parents() -> tuple[dict[str, tuple[str, str]], list[str]]:
    """controller -> (version, folder to make the group in), and why the others cannot be had
    (of :data:`CONTROLLERS`; :data:`ACCOUNTING`'s are found on cgroup v1 only, where mounted)."""
    mounts, own = _mounts(), _own_cgroups()
    found: dict[str, tuple[str, str]] = {}
    why: list[str] = []
    for c in CONTROLLERS + ACCOUNTING:
        v1 = [m for m in mounts if m[0] == "cgroup" and c in m[3]]
        if v1 and c in own:
            _, mount, root, _ = v1[0]
            found[c] = ("v1", _below(mount, root, own[c]))
    v2 = [m for m in mounts if m[0] == "cgroup2"]
    missing = [c for c in CONTROLLERS if c not in found]
    if missing and v2:
        _, mount, root, _ = v2[0]
        candidates = [_below(mount, root, own.get("", "/")), mount]
        for parent in dict.fromkeys(candidates):
            available = set(_read(os.path.join(parent, "cgroup.controllers")).split())
            usable = [c for c in missing if c in available]
            if not usable:
                continue
            enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
            try:
                todo = [c for c in usable if c not in enabled]
                if todo:
                    _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in todo))
            except OSError as e:
                why.append(f"cannot enable {', '.join(todo)} below {parent}: {e.strerror}")
                continue
            for c in usable:
                found[c] = ("v2", parent)
            missing = [c for c in missing if c not in found]
            if not missing:
                break
    if missing and not why:
        why.append(f"no cgroup hierarchy offers {', '.join(missing)} (see /proc/self/mountinfo)")
    return found, why


@dataclass
class Group:
    """One submission's cgroup (one folder per v1 hierarchy, one folder on v2)."""

    budget: Budget
    folders: dict[str, tuple[str, str]] = field(default_factory=dict)  # controller -> (version, folder)
    #: controllers joined for accounting only (v1's cpuacct in a hierarchy of its own)
    accounting: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: the group's CPU seconds, read by :meth:`remove` once its processes were gone (None: unknown)
    cpu_used: float | None = None

    def _all(self) -> dict[str, tuple[str, str]]:
        return {**self.accounting, **self.folders}

    @property
    def procs_files(self) -> list[str]:
        return sorted({os.path.join(d, "cgroup.procs") for _, d in self._all().values()})

    def _file(self, controller: str, v1: str, v2: str) -> str | None:
        if controller not in self._all():
            return None
        version, folder = self._all()[controller]
        return os.path.join(folder, v1 if version == "v1" else v2)

    def cpu_seconds(self) -> float | None:
        """CPU time (user and system) every process of the group has used so far, all together,
        as the kernel counts it (v1: ``cpuacct.usage``, in the cpuacct hierarchy or a ``cpu``
        hierarchy mounted with it; v2: ``usage_usec`` of ``cpu.stat``); ``None`` if unreadable."""
        for controller in ("cpuacct", "cpu"):
            path = self._file(controller, "cpuacct.usage", "cpu.stat")
            text = _read(path).strip() if path else ""
            if not text:
                continue
            if text.isdigit():  # v1: nanoseconds
                return int(text) / 1e9
            if "usage_usec" in text:  # v2: microseconds
                return _field(text, "usage_usec") / 1e6
        return None

    def oom_kills(self) -> int:
        """Processes the OOM killer has killed in this group (its memory budget was exceeded)."""
        path = self._file("memory", "memory.oom_control", "memory.events")
        return _field(_read(path), "oom_kill") if path else 0

    def refused_forks(self) -> int:
        """Forks and thread starts refused because the process budget was reached."""
        path = self._file("pids", "pids.events", "pids.events")
        return _field(_read(path), "max") if path else 0

    def memory_peak(self) -> int | None:
        path = self._file("memory", "memory.max_usage_in_bytes", "memory.peak")
        text = _read(path).strip() if path else ""
        return int(text) if text.isdigit() else None

    def pids(self) -> set[int]:
        return {int(p) for f in self.procs_files for p in _read(f).split()}

    def _configure(self) -> None:
        b = self.budget
        for c, (version, d) in self.folders.items():
            if c == "memory" and version == "v1":
                _write(os.path.join(d, "memory.limit_in_bytes"), b.memory_bytes)
                if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):  # no escape into swap
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), b.memory_bytes)
            elif c == "memory":
                _write(os.path.join(d, "memory.max"), b.memory_bytes)
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), 0)
            elif c == "pids":
                _write(os.path.join(d, "pids.max"), b.processes)
            elif c == "cpu" and version == "v1":
                _write(os.path.join(d, "cpu.shares"), max(2, b.cpu_weight * 1024 // 100))
                if b.cpus > 0:
                    _write(os.path.join(d, "cpu.cfs_period_us"), 100_000)
                    _write(os.path.join(d, "cpu.cfs_quota_us"), int(b.cpus * 100_000))
            elif c == "cpu":
                _write(os.path.join(d, "cpu.weight"), max(1, min(10_000, b.cpu_weight)))
                _write(os.path.join(d, "cpu.max"), f"{int(b.cpus * 100_000) if b.cpus > 0 else 'max'} 100000")

    def remove(self, timeout: float = 10.0) -> bool:
        """Kill every process in the group, then remove its folders. ``False`` if some stayed.
        The group's CPU time is read last, just before its folders went (:attr:`cpu_used`)."""
        folders = sorted({d for _, d in self._all().values()})
        kill_file = [os.path.join(d, "cgroup.kill") for d in folders if os.path.exists(os.path.join(d, "cgroup.kill"))]
        deadline = time.monotonic() + timeout
        while True:
            for f in kill_file:  # cgroup v2: the kernel kills the group at once (a fork bomb too)
                try:
                    _write(f, 1)
                except OSError:
                    pass
            pids = self.pids()
            for pid in pids:  # v1: kill in rounds until nothing is left
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            # read before each removal try: the folders go as soon as the last process leaves,
            # which may be right after this read (a killed process uses no more CPU time)
            used = self.cpu_seconds()
            if used is not None:
                self.cpu_used = used
            left = []
            for d in folders:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            folders = left
            if not folders:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)  # killed processes take a moment to leave the group


def create(budget: Budget, name: str | None = None) -> tuple[Group | None, str | None]:
    """A new group with these limits, or ``(None, why it cannot be made here)``."""
    found, why = _parents()
    if not found:
        return None, "; ".join(why)
    name = name or f"course-grading-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    group = Group(budget)
    made: dict[str, str] = {}
    try:
        for c, (version, parent) in found.items():
            folder = os.path.join(parent, name)
            if folder not in made.values():
                os.mkdir(folder)
            made[c] = folder
            (group.accounting if c in ACCOUNTING else group.folders)[c] = (version, folder)
        group._configure()
    except OSError as e:
        group.remove(timeout=2)
        return None, f"cannot make a cgroup in {os.path.dirname(e.filename or '') or 'its hierarchy'}: {e.strerror}"
    missing = [c for c in CONTROLLERS if c not in found]
    if missing:
        group.remove(timeout=2)
        return None, "; ".join(why) or f"no {', '.join(missing)} controller"
    return group, None


def join_command(group: Group | None, cmd: list[str]) -> list[str]:
    """``cmd``, started in ``group``: a shell writes its pid into the group, then execs ``cmd``."""
    if group is None:
        return list(cmd)
    files = group.procs_files
    if any(any(ch.isspace() for ch in f) for f in files):
        raise ValueError(f"cgroup paths with spaces are not supported: {files}")
    script = 'for f in $0; do echo $$ > "$f" || exit 125; done; exec "$@"'
    return ["/bin/sh", "-c", script, " ".join(files), *cmd]
