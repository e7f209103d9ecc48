"""Reading where a blocked rank is, from the text :mod:`faulthandler` writes (pure functions).

A rank dumps every thread's stack on SIGUSR1, even while its main thread is inside a C++
collective. :func:`parse_stack` picks the main thread's frames; :func:`where` finds the
learner's innermost line in them and the library call it waits in.
"""

from __future__ import annotations

import linecache
import os
import re

from helpers._pool.errors import RankState

__all__ = ["parse_stack", "where", "dump_complete", "is_library_file"]

_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
_POOL_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SPAWN = os.path.join(os.path.dirname(_POOL_DIR.rstrip(os.sep)), "spawn.py")
_MAIN = "rank_main"  # the function every rank's main thread runs (helpers/_pool/rank.py)
_AFTER_FN = {"result_message", "send", "dump_plain", "encode"}  # rank.py sending a result
_LIB_DIRS: tuple[str, ...] | None = None


def _library_dirs() -> tuple[str, ...]:
    """torch, the standard library and site-packages: code that is not the learner's."""
    global _LIB_DIRS
    if _LIB_DIRS is None:
        import sysconfig

        import torch

        paths = sysconfig.get_paths()
        dirs = {os.path.abspath(paths[k]) + os.sep
                for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
        dirs.add(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
        dirs.add(_POOL_DIR)
        _LIB_DIRS = tuple(sorted(dirs))
    return _LIB_DIRS


def is_library_file(path: str) -> bool:
    if path.startswith("<"):
        return True
    p = os.path.abspath(path)
    return p == _SPAWN or p.startswith(_library_dirs())


def code_only(line: str) -> str:
    """A source line without its trailing comment and whitespace."""
    import io
    import tokenize

    line = line.strip()
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return line
    for tok in toks:
        if tok.type == tokenize.COMMENT:
            return line[: tok.start[1]].rstrip()
    return line


def _blocks(dump: str) -> list[list[tuple[str, int, str]]]:
    blocks, current = [], None
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            if current:
                blocks.append(current)
            current = []
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            current.append((m["file"], int(m["line"]), m["func"].strip()))
    if current:
        blocks.append(current)
    return blocks


def parse_stack(dump: str) -> list[tuple[str, int, str]]:
    """Frames (file, line, function) of the rank's main thread, innermost first."""
    blocks = _blocks(dump)
    for frames in blocks:
        if any(func == _MAIN for _, _, func in frames):
            return frames
    return blocks[0] if blocks else []


def dump_complete(dump: str) -> bool:
    """Whether ``dump`` holds the main thread's whole stack (faulthandler writes it last)."""
    frames = parse_stack(dump)
    return (any(func == _MAIN for _, _, func in frames)
            and re.search(r"line \d+ in <module>\s*$", dump) is not None)


def where(rank: int, frames: list[tuple[str, int, str]], joined: bool = True) -> RankState:
    """Where a blocked rank is: its innermost line of user code and the call it waits in."""
    state = RankState(rank=rank, finished=False, stack=frames,
                      phase="running" if joined else "starting")
    inner_library = None
    for file, line, func in frames:  # innermost first
        if is_library_file(file):
            if func not in ("wrapper", _MAIN) and not file.startswith("<"):
                inner_library = inner_library or func
            continue
        state.function, state.filename, state.lineno = func, file, line
        state.line = code_only(linecache.getline(file, line)) or None
        break
    if state.function is not None:
        # the library function the user's line called: the outermost library frame above it
        called = None
        for file, line, func in frames:
            if (file, line, func) == (state.filename, state.lineno, state.function):
                break
            if is_library_file(file) and func != "wrapper":
                called = func
        state.waiting_in = called
        return state
    if joined and _outermost_below_main(frames) in _AFTER_FN:
        state.phase = "returning"
    elif not joined:
        state.waiting_in = _outermost_below_main(frames) or inner_library
    else:
        state.waiting_in = inner_library
    return state


def _outermost_below_main(frames: list[tuple[str, int, str]]) -> str | None:
    """The function rank_main itself was calling (init_process_group, result_message, ...)."""
    outer_first = [func for _, _, func in reversed(frames)]
    if _MAIN not in outer_first:
        return None
    for func in outer_first[outer_first.index(_MAIN) + 1:]:
        if func != "wrapper":  # torch's logging decorators
            return func
    return None
