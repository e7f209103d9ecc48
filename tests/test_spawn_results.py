"""What a rank sends back, and why reading it can never run code in the caller.

Control messages (results, errors, timings) travel as JSON headers plus raw bytes; with
``plain_results=True`` a return value is read with ``torch.load(weights_only=True)``. The
attacks here are real: ranks return objects whose unpickling would run code, and ranks write
forged bytes straight onto the pool's result pipe.
"""

from __future__ import annotations

import os
import pickle
import struct

import pytest
import torch
import torch.distributed as dist

from helpers._pool import messages
from helpers.spawn import (BadMessage, RankRaised, UnsendableResult, WorkerError, live_ranks,
                           run)


# ----------------------------------------------------------------------------- the wire format


def _frame(header: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">4sII", b"HSP1", len(header), len(payload)) + header + payload


def test_every_message_survives_the_wire_even_one_byte_at_a_time():
    sent = [messages.Joined(0.5), messages.Returned(1.25, b"\x00PAYLOAD\xff" * 1000),
            messages.Raised(2.0, "ValueError", "bad \u00e9 batch", "Traceback ...\n  line 3\n"),
            messages.Unsendable(3.0, "_thread.lock", "cannot be serialised")]
    wire = b"".join(messages.encode(m) for m in sent)
    d = messages.Decoder()
    got = []
    for i in range(len(wire)):
        got += d.feed(wire[i:i + 1])
    assert got == sent and d.pending == 0


@pytest.mark.parametrize("wire, complaint", [
    (pickle.dumps({"kind": "returned"}), "not b'HSP1'"),
    (struct.pack(">4sII", b"HSP1", messages.MAX_HEADER + 1, 0), "header of"),
    (_frame(b"{oops"), "not JSON"),
    (_frame(b"[]"), "names no known message"),
    (_frame(b'{"kind": "pickle"}'), "names no known message"),
    (_frame(b'{"kind": "joined"'), "not JSON"),
    (_frame(b'{"kind": "joined", "seconds": "1"}'), "seconds is str"),
    (_frame(b'{"kind": "joined", "seconds": true}'), "seconds is bool"),
    (_frame(b'{"kind": "joined", "seconds": 1, "extra": 2}'), "with fields"),
    (_frame(b'{"kind": "raised", "seconds": 1, "exc_type": "E", "message": {}, "traceback": ""}'),
     "message is dict"),
    (_frame(b'{"kind": "joined", "seconds": 1}', b"abc"), "payload"),
])
def test_anything_but_a_well_formed_frame_is_refused(wire, complaint):
    d = messages.Decoder()
    with pytest.raises(messages.MessageError, match=complaint):
        d.feed(wire)
    assert d.feed(messages.encode(messages.Joined(1.0))) == []  # a broken pipe stays broken


def test_long_texts_are_cut_to_fit_a_header():
    huge = "x" * (4 * messages.MAX_HEADER)
    [msg] = messages.Decoder().feed(messages.encode(messages.Raised(0.0, "E", huge, huge)))
    assert "[... cut ...]" in msg.message and len(msg.message) < messages.MAX_HEADER


# ----------------------------------------------------------------------------- plain results


def _plain_value():
    return [None, True, -3, 2.5, "s\u00e9", b"\x00\xff",
            (torch.arange(3) * dist.get_rank(), {"w": torch.ones(2, dtype=torch.bfloat16)}),
            {1: [b"x"], "nested": {"deep": [[[1.0]]]}}]


def test_plain_results_round_trip_every_plain_type():
    out = run(_plain_value, world_size=2, plain_results=True, echo=False)
    for rank, value in enumerate(out):
        assert value[:6] == [None, True, -3, 2.5, "s\u00e9", b"\x00\xff"]
        assert torch.equal(value[6][0], torch.arange(3) * rank)
        assert value[6][1]["w"].dtype == torch.bfloat16
        assert value[7] == {1: [b"x"], "nested": {"deep": [[[1.0]]]}}


class _RunsCodeWhenLoaded:
    """Unpickling this creates the folder `marker`: code chosen by whoever made the bytes."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_value_that_would_run_code_when_loaded_is_refused_and_never_loaded(tmp_path):
    marker = str(tmp_path / "code_ran_in_the_caller")

    def answer():
        return [1.0, {"loss": _RunsCodeWhenLoaded(marker)}] if dist.get_rank() == 1 else 0

    # The attack is real: the default (trusted) codec runs it in the caller...
    run(answer, world_size=2, echo=False)
    assert os.path.isdir(marker)
    os.rmdir(marker)
    # ...plain_results refuses it in the rank, naming the rank, the type and where it was.
    with pytest.raises(UnsendableResult) as info:
        run(answer, world_size=2, plain_results=True, echo=False)
    assert not os.path.exists(marker)
    err = info.value
    assert err.rank == 1 and err.type_name.endswith("_RunsCodeWhenLoaded")
    assert isinstance(err, WorkerError) and err.exc_type == "TypeError"
    assert "rank 1 returned a " in str(err) and "the result[1]['loss']" in str(err)
    assert "plain data" in str(err)


def test_a_numpy_number_is_refused_with_the_fix():
    def mean():
        import numpy as np

        return np.float64(1.5) if dist.get_rank() == 1 else 1.5

    with pytest.raises(UnsendableResult) as info:
        run(mean, world_size=2, plain_results=True, echo=False)
    assert info.value.rank == 1 and info.value.type_name == "numpy.float64"
    assert "float(x)" in str(info.value)


def _forge_result(frame: bytes) -> None:
    """Write `frame` on every pipe this rank can write to but stdout and stderr, as code that
    went looking for the pool's result pipe would (a rank holds only the pool's own pipes)."""
    import stat

    for fd in range(3, 1024):
        try:
            st = os.fstat(fd)
            if not stat.S_ISFIFO(st.st_mode) or st in (os.fstat(1), os.fstat(2)):
                continue
            os.write(fd, frame)
        except OSError:  # not open, or not open for writing
            continue


def _evil_torch_zip(marker: str) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(_RunsCodeWhenLoaded(marker), buf)
    return buf.getvalue()


@pytest.mark.parametrize("make_payload", [
    lambda marker: pickle.dumps(_RunsCodeWhenLoaded(marker)),  # a bare pickle
    _evil_torch_zip,  # the same object inside torch.save's zip format
], ids=["pickle", "torch-zip"])
def test_a_forged_result_on_the_pipe_runs_nothing_in_the_caller(tmp_path, make_payload):
    marker = str(tmp_path / "code_ran_in_the_caller")
    payload = make_payload(marker)

    def forger():
        if dist.get_rank() == 1:
            _forge_result(messages.encode(messages.Returned(0.0, payload)))
        return dist.get_rank()

    # Control: the same bytes loaded by the trusted codec do run code.
    if payload.startswith(b"\x80"):
        pickle.loads(payload)
        assert os.path.isdir(marker)
        os.rmdir(marker)
    with pytest.raises(UnsendableResult) as info:
        run(forger, world_size=2, plain_results=True, echo=False)
    assert not os.path.exists(marker)
    assert info.value.rank == 1
    assert "could not be read safely" in str(info.value)
    if make_payload is _evil_torch_zip:
        assert "unsupported GLOBAL posix.mkdir" in str(info.value)


@pytest.mark.parametrize("garbage", [
    pickle.dumps(_RunsCodeWhenLoaded("/nonexistent/never")),  # no frame at all
    _frame(b'{"kind": "raised", "seconds": [1, 2, 3]}'),
], ids=["raw-pickle", "bad-field"])
def test_garbage_on_the_result_pipe_is_a_bad_message_naming_the_rank(garbage):
    def forger():
        if dist.get_rank() == 1:
            _forge_result(garbage)
            dist.barrier()  # rank 0 waits here: only the forged bytes can end this run
        else:
            dist.barrier()

    with pytest.raises(BadMessage) as info:
        run(forger, world_size=2, timeout=600, echo=False)
    assert info.value.rank == 1 and "rank 1 wrote something on the pool's result pipe" in str(info.value)
    assert live_ranks() == []


def test_an_unloadable_result_names_the_rank(tmp_path):
    """A class the rank can import but the caller cannot: loading fails here, not silently."""
    (tmp_path / "only_in_the_rank.py").write_text("class Thing:\n    pass\n")

    def make():
        import sys

        sys.path.insert(0, str(tmp_path))
        import only_in_the_rank

        return only_in_the_rank.Thing() if dist.get_rank() == 1 else None

    with pytest.raises(UnsendableResult) as info:
        run(make, world_size=2, echo=False)
    assert info.value.rank == 1
    assert "could not be loaded here (ModuleNotFoundError" in str(info.value)


def test_an_exception_travels_as_text_with_its_type_name():
    class Custom(Exception):
        def __reduce__(self):  # never called: exceptions are not pickled
            raise AssertionError("the exception object was pickled")

    def fail():
        raise Custom("line one\nline two \u00e9")

    with pytest.raises(RankRaised) as info:
        run(fail, world_size=2, plain_results=True, echo=False)
    err = info.value
    assert err.exc_type.endswith("Custom") and err.exc_message == "line one\nline two \u00e9"
    assert "raise Custom" in err.remote_traceback


# ----------------------------------------------------------------------------- per-rank inputs, the caller's look


def _own_inputs_only(shared, mine):
    import glob

    folder = os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]).rsplit(os.sep, 1)[0]
    return {"rank": dist.get_rank(), "shared": shared, "mine": mine,
            "jobs_left": sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "job*")))}


def test_each_rank_gets_only_its_own_arguments_and_finds_no_other_job():
    got = run(_own_inputs_only, "all", world_size=3, rank_args=[("zero",), ("one",), ("two",)],
              echo=False)
    assert [(g["rank"], g["shared"], g["mine"]) for g in got] == [
        (0, "all", "zero"), (1, "all", "one"), (2, "all", "two")]
    assert all(g["jobs_left"] == [] for g in got)  # each job file is gone before any fn runs


def test_rank_args_need_one_tuple_per_rank():
    with pytest.raises(ValueError, match="rank_args needs one tuple per rank: 3 ranks, got 2"):
        run(_own_inputs_only, "all", world_size=3, rank_args=[("a",), ("b",)])


def _last_waits_for_the_callers_look(flag):
    import time

    if dist.get_rank() == 1:
        while not os.path.exists(flag):  # made by the caller's on_return for rank 0
            time.sleep(0.01)
    return dist.get_rank()


def test_on_return_runs_in_the_caller_as_each_result_arrives(tmp_path):
    """Rank 1 returns only after the caller's callback for rank 0 has run: so it runs while
    other ranks are still going, in the caller (it sees the caller's own list)."""
    flag, seen = tmp_path / "looked", []

    def look(rank):
        seen.append((rank, os.getpid()))
        flag.touch()

    assert run(_last_waits_for_the_callers_look, str(flag), world_size=2, on_return=look,
               echo=False, timeout=30) == [0, 1]
    assert seen == [(0, os.getpid()), (1, os.getpid())]


def _talks_then_raises(fail_on):
    import sys

    rank = dist.get_rank()
    print(f"out {rank}")
    print(f"err {rank}", file=sys.stderr)
    os.write(1, f"fd {rank}\n".encode())
    sys.stdout = open(os.devnull, "w")  # what this rank writes from now on goes nowhere
    print("hidden")
    if rank == fail_on:
        raise ValueError("stop")
    return rank


@pytest.mark.parametrize("fail_on", [None, 1])
def test_outputs_hold_what_each_rank_wrote_on_its_own_pipes(fail_on):
    """Read by the caller from each rank's pipes: print, sys.stderr and fd 1 alike, per rank, also
    when a rank raised; what never reached the pipe is not there."""
    outputs = []
    try:
        run(_talks_then_raises, fail_on, world_size=3, echo=False, outputs=outputs)
    except WorkerError:
        assert fail_on is not None
    else:
        assert fail_on is None
    assert len(outputs) == 3
    # the ranks that surely wrote everything: all of them, or the one that raised (the pool
    # stops at once then, perhaps before another rank has written)
    for r in range(3) if fail_on is None else [fail_on]:
        assert outputs[r]["stdout"] == [f"out {r}", f"fd {r}"], outputs
        assert outputs[r]["stderr"][:1] == [f"err {r}"], outputs


# ----------------------------------------------------------------------------- system calls seen by the caller


def _syncs(folder):
    import subprocess
    import sys

    rank = dist.get_rank()
    path = os.path.join(folder, f"rank{rank}")
    with open(path, "wb") as f:
        f.write(b"data")
        f.flush()
        os.fsync(f.fileno())
    # a child of the rank inherits the watch
    subprocess.run([sys.executable, "-c", f"import os; fd = os.open({path!r}, os.O_RDONLY); os.fdatasync(fd)"],
                   check=True)
    return open(path, "rb").read()


def test_on_syscall_sees_every_fsync_of_the_watched_ranks_and_children_and_changes_nothing(tmp_path):
    from helpers.spawn import can_watch_syscalls

    assert can_watch_syscalls()  # Linux x86_64 / aarch64: the course's grading machines
    seen = []
    got = run(_syncs, str(tmp_path), world_size=3, echo=False, watch_ranks=(0, 2),
              on_syscall=lambda rank, name, fd: seen.append((rank, name)))
    assert got == [b"data"] * 3  # the calls ran, unchanged
    assert sorted(seen) == [(0, "fdatasync"), (0, "fsync"), (2, "fdatasync"), (2, "fsync")]


def test_watching_unknown_calls_or_ranks_is_refused():
    with pytest.raises(ValueError, match="watch_syscalls can name fsync, fdatasync"):
        run(_syncs, "/tmp", world_size=2, on_syscall=print, watch_syscalls=("write",))
    with pytest.raises(ValueError, match="watch_ranks must be ranks of the pool"):
        run(_syncs, "/tmp", world_size=2, on_syscall=print, watch_ranks=(2,))
