"""Check that this kernel can run the course, and say what to fix if not.

Run by the first cell of ``notebooks/start/00_start_here.ipynb``.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["check", "Check", "EnvironmentProblem"]

ROOT = Path(__file__).resolve().parent.parent
FIX_ALL = "From the course folder run `make lab` (it creates .venv and installs everything), then pick the kernel it starts."


class EnvironmentProblem(RuntimeError):
    """Something the course needs is missing; the message says what to do."""


@dataclass
class Check:
    name: str
    ok: bool
    found: str
    fix: str = ""
    warning: str = ""  # worth knowing, but the course runs (printed as WARN, not a FIX)


def _os_check(platform_name: str | None = None) -> Check:
    """The operating system: Linux and macOS run the course; Windows needs WSL2."""
    import platform

    from helpers._pool.platform import check_supported

    name = platform_name or sys.platform
    found = f"{platform.system()} {platform.release()} ({platform.machine()})"
    try:
        check_supported(name)
    except OSError as e:
        return Check("OS: Linux or macOS", False, found, str(e))
    return Check("OS: Linux or macOS", True, found)


def _torch_build_check(torch) -> Check:
    """A CUDA build of torch runs the course (on the CPU) but is a large download."""
    cuda = torch.version.cuda
    if cuda is None:
        return Check("torch build", True, f"{torch.__version__} (CPU)")
    return Check("torch build", True, f"{torch.__version__} (CUDA {cuda})",
                 warning=("a CUDA build: the course runs on the CPU either way; the pinned CPU "
                          "wheel in requirements.txt is a much smaller download."))


def _pinned() -> dict[str, str]:
    pins = {}
    req = ROOT / "requirements.txt"
    if req.exists():
        for line in req.read_text().splitlines():
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                pins[name.strip().lower()] = version.strip()
    return pins


def _version(dist_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None


def check(verbose: bool = True, run_pool: bool = True) -> list[Check]:
    """Run every check; print a table; raise :class:`EnvironmentProblem` listing the fixes."""
    results = [_os_check()]
    py = sys.version_info
    results.append(Check("Python 3.11 to 3.13", (3, 11) <= py[:2] <= (3, 13),
                         sys.version.split()[0], "Install Python 3.11 and run `make lab`."))
    pins = _pinned()
    for name in ("torch", "nbgrader", "ipywidgets", "matplotlib", "papermill", "cloudpickle",
                 "torchmetrics"):
        found = _version(name)
        want = pins.get(name)
        ok = found is not None and (want is None or found.split("+")[0] == want)
        results.append(Check(name + (f" {want}" if want else ""), ok, found or "missing",
                             f"pip install {name}=={want}  (or: {FIX_ALL})" if want else FIX_ALL))
    try:
        import torch
        import torch.distributed as dist

        results.append(_torch_build_check(torch))
        results.append(Check("gloo backend", dist.is_available() and dist.is_gloo_available(),
                             "available" if dist.is_gloo_available() else "missing",
                             "Reinstall torch==2.13.0 from requirements.txt."))
    except ImportError as e:
        results.append(Check("torch imports", False, str(e), FIX_ALL))
    try:
        importlib.import_module("helpers.spawn")
        results.append(Check("helpers package", True, str(Path(__file__).parent)))
    except ImportError as e:  # pragma: no cover - this module is in helpers
        results.append(Check("helpers package", False, str(e), FIX_ALL))
    results.append(Check("CPU cores", (os.cpu_count() or 1) >= 1, str(os.cpu_count()), ""))
    if run_pool and all(c.ok for c in results):
        from helpers.spawn import run

        try:
            ranks = run(_whoami, world_size=2, timeout=60, echo=False)
            ok = ranks == [(0, 2), (1, 2)]
            results.append(Check("2-rank gloo pool", ok, f"ranks {ranks}", FIX_ALL))
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            results.append(Check("2-rank gloo pool", False, f"{type(e).__name__}: {e}", FIX_ALL))
    if verbose:
        width = max(len(c.name) for c in results)
        for c in results:
            status = "FIX " if not c.ok else "WARN" if c.warning else "ok  "
            print(f"{status}  {c.name:<{width}}  {c.found}" + (f": {c.warning}" if c.warning else ""))
    bad = [c for c in results if not c.ok]
    if bad:
        raise EnvironmentProblem(
            "This kernel cannot run the course yet:\n"
            + "\n".join(f"- {c.name}: found {c.found}. {c.fix}" for c in bad)
        )
    return results


def _whoami():
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()
