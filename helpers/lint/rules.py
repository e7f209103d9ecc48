"""The codes the linter reports, what each finds, and what each message tells the reader.

Every message says what goes wrong when the code runs on several ranks, then what to do.
Taught in the developer lesson on common mistakes (``developer/02_common_mistakes``).
"""

from __future__ import annotations

from dataclasses import dataclass

CODES = {
    "ORK101": "a collective that only some ranks reach",
    "ORK102": "a write that every rank performs",
    "ORK103": "a read on every rank of a file rank 0 has just written, with no barrier between",
    "ORK104": "a logged metric that is this rank's own value",
    "ORK105": "a stop decision taken on this rank's own metric",
    "ORK106": "the state_dict() of a DDP wrapper saved ('module.' prefix)",
    "ORK107": "torch.load without map_location",
}


@dataclass(frozen=True, order=True)
class Finding:
    """One finding: ``line``/``col`` are 1-based; ``cell`` is the 1-based cell number of a notebook."""

    line: int
    col: int
    code: str
    message: str
    cell: int | None = None

    def location(self, path: str = "") -> str:
        where = f"cell {self.cell}:{self.line}" if self.cell is not None else str(self.line)
        return f"{path}:{where}:{self.col}" if path else f"{where}:{self.col}"

    def format(self, path: str = "") -> str:
        return f"{self.location(path)}: {self.code} {self.message}"


def ork101(call: str, only_rank0: bool, after_exit: str | None, inside: str | None,
           guard_line: int | None = None) -> str:
    what = f"{call}, which runs {inside}," if inside else call
    where = f"the branch on the rank at line {guard_line}" if guard_line else "a branch on the rank"
    paired = ("collectives are matched by order, not by line, so it pairs with whatever collective "
              "the other ranks call next: it can return wrong data without an error, fail, or wait "
              "until the job times out")
    if only_rank0:
        return (f"{what} is reached by rank 0 only (inside {where}): the other ranks never call it, and "
                f"{paired}; call every collective on every rank (move it after the if block)")
    if after_exit:
        at = f" (the if at line {guard_line})" if guard_line else ""
        return (f"{what} comes after a `{after_exit}` that depends on the rank{at}: the ranks that left "
                f"never call it, and {paired}; let every rank reach every collective")
    return (f"{what} is not reached by every rank (it sits in {where}): {paired}; call every "
            f"collective on every rank")


def ork102(call: str) -> str:
    return (f"{call} runs on every rank: every process writes the same file at once, which can leave it "
            f"torn or mixed; write from rank 0 only (`if rank == 0:`), then dist.barrier() before anyone "
            f"reads it")


def ork103(read: str, write_line: int) -> str:
    return (f"{read} runs on every rank right after rank 0's write (line {write_line}) with no barrier "
            f"in between: the other ranks can find the file missing or half-written; call "
            f"dist.barrier() after the write, outside the `if`")


def ork104(name: str, set_at: int | None = None) -> str:
    return (f"logs `{name}`, this rank's own value{_from(set_at)}: it describes one rank's slice of the data, not the "
            f"run; all_reduce a [sum, count] pair first and log the combined value (or label the line "
            f"with the rank)")


def ork105(name: str, set_at: int | None = None) -> str:
    return (f"stops on `{name}`, this rank's own value{_from(set_at)}: the ranks can decide differently, so "
            f"some leave the loop while the others go on; collectives are matched by order, so the next "
            f"one of the ranks that go on pairs with whatever the others call next: it can return wrong "
            f"data without an error, fail, or wait until the job times out; decide from an all-reduced "
            f"value so that every rank stops at the same step")


def ork106(expr: str, wrapped_at: int | None = None) -> str:
    wrapper = f"the DDP wrapper made at line {wrapped_at}" if wrapped_at else "the DDP wrapper"
    return (f"saves {expr}.state_dict() of {wrapper}: every key gets a 'module.' prefix and the "
            f"file will not load into an unwrapped model; save {expr}.module.state_dict()")


def _from(line: int | None) -> str:
    return f" (set at line {line} and never all-reduced)" if line else ""


def ork107() -> str:
    return ("torch.load without map_location: tensors saved from a GPU are loaded back onto that GPU on "
            "every rank (out of memory, or the wrong device); pass map_location=\"cpu\" (or this rank's "
            "device)")
