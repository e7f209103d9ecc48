"""What a rank tells the caller, and how it travels: JSON headers and raw bytes, never pickle.

Every message from a rank to the caller goes over one pipe per rank as a *frame*::

    b"HSP1" | header length (4 bytes, big-endian) | payload length (4 bytes) | header | payload

The header is a JSON object (``{"kind": "returned", "seconds": 0.12}``); the payload is raw
bytes (the serialised return value), empty for every other message. The caller decodes
frames with :class:`Decoder`, which only ever runs ``json.loads`` and checks each field's
type: whatever bytes a rank writes on its pipe, decoding them cannot run code in the caller.

A rank's return value is the one thing that may need more than JSON. Two codecs:

* ``plain`` (``run(..., plain_results=True)``, used for grading): the value must be plain data
  (:data:`PLAIN_TYPES`); the rank writes it with ``torch.save`` and the caller reads it with
  ``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers,
  then checks the result is plain data again.
* ``cloudpickle`` (the default, for lessons, where a learner runs their own code in their own
  kernel): any picklable value round-trips, at the price of trusting the rank.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
from typing import Any, Union

__all__ = ["Joined", "Returned", "Raised", "Unsendable", "Message", "encode", "send",
           "Decoder", "MessageError", "PLAIN_TYPES", "find_unplain", "dump_plain",
           "load_plain", "MAX_HEADER"]

MAGIC = b"HSP1"
_PREFIX = struct.Struct(">4sII")
MAX_HEADER = 1 << 20  # a header longer than this is refused (texts are truncated to fit)
MAX_PAYLOAD = (1 << 32) - 1
_MAX_TEXT = 200_000  # characters of an exception message or traceback that are sent


# ----------------------------------------------------------------------------- messages


@dataclasses.dataclass(frozen=True)
class Joined:
    """The rank has joined the process group (or, without one, is about to call ``fn``)."""

    seconds: float  # from the rank's start


@dataclasses.dataclass(frozen=True)
class Returned:
    """``fn`` returned; ``payload`` is its value, serialised with the pool's codec."""

    seconds: float  # from the start of fn
    payload: bytes = dataclasses.field(repr=False, default=b"")


@dataclasses.dataclass(frozen=True)
class Raised:
    """``fn`` raised (``SystemExit`` and ``KeyboardInterrupt`` included)."""

    seconds: float
    exc_type: str
    message: str
    traceback: str


@dataclasses.dataclass(frozen=True)
class Unsendable:
    """``fn`` returned a value that cannot be serialised with the pool's codec."""

    seconds: float
    type_name: str
    reason: str


Message = Union[Joined, Returned, Raised, Unsendable]
_KINDS: dict[str, type] = {"joined": Joined, "returned": Returned, "raised": Raised,
                           "unsendable": Unsendable}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


class MessageError(ValueError):
    """Bytes on a rank's result pipe that are not a well-formed message."""


def encode(msg: Message) -> bytes:
    """One frame holding ``msg``."""
    fields = dataclasses.asdict(msg)
    payload = fields.pop("payload", b"")
    for name, value in fields.items():
        if isinstance(value, str) and len(value) > _MAX_TEXT:
            fields[name] = value[: _MAX_TEXT // 2] + "\n[... cut ...]\n" + value[-_MAX_TEXT // 2:]
    header = json.dumps({"kind": _KIND_OF[type(msg)], **fields}).encode("ascii")
    if len(header) > MAX_HEADER or len(payload) > MAX_PAYLOAD:
        raise ValueError(f"message too large to send: {len(header)} + {len(payload)} bytes")
    return _PREFIX.pack(MAGIC, len(header), len(payload)) + header + payload


def send(fd: int, msg: Message) -> None:
    """Write ``msg`` on ``fd`` (blocking), all of it."""
    view = memoryview(encode(msg))
    while view:
        view = view[os.write(fd, view):]


class Decoder:
    """Turns the bytes of one rank's result pipe into messages, with ``json`` only.

    ``feed(data)`` returns the messages completed by ``data``; it raises
    :class:`MessageError` at the first byte that cannot be part of a valid frame.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.broken = False

    def feed(self, data: bytes) -> list[Message]:
        if self.broken:
            return []
        self._buf += data
        out = []
        while len(self._buf) >= _PREFIX.size:
            magic, hlen, plen = _PREFIX.unpack_from(self._buf)
            if magic != MAGIC:
                self._fail(f"a frame starts with {bytes(self._buf[:16])!r}, not {MAGIC!r}")
            if hlen > MAX_HEADER:
                self._fail(f"a header of {hlen} bytes (at most {MAX_HEADER} are accepted)")
            end = _PREFIX.size + hlen + plen
            if len(self._buf) < end:
                break
            header = bytes(self._buf[_PREFIX.size:_PREFIX.size + hlen])
            payload = bytes(self._buf[_PREFIX.size + hlen:end])
            del self._buf[:end]
            out.append(self._message(header, payload))
        return out

    @property
    def pending(self) -> int:
        """Bytes received that do not complete a frame yet."""
        return len(self._buf)

    def _fail(self, what: str):
        self.broken = True
        self._buf.clear()
        raise MessageError(what)

    def _message(self, header: bytes, payload: bytes) -> Message:
        try:
            fields = json.loads(header.decode("ascii"))
        except (UnicodeDecodeError, ValueError) as e:
            self._fail(f"a header that is not JSON ({e})")
        if not isinstance(fields, dict) or fields.get("kind") not in _KINDS:
            self._fail(f"a header that names no known message: {header[:80]!r}")
        cls = _KINDS[fields.pop("kind")]
        expected = {f.name: f.type for f in dataclasses.fields(cls) if f.name != "payload"}
        if set(fields) != set(expected):
            self._fail(f"a {cls.__name__} message with fields {sorted(fields)}, "
                       f"not {sorted(expected)}")
        for name, kind in expected.items():
            value = fields[name]
            if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
                fields[name] = float(value)
            elif kind == "str" and isinstance(value, str):
                pass
            else:
                self._fail(f"a {cls.__name__} message whose {name} is {type(value).__name__}")
        if cls is Returned:
            return Returned(payload=payload, **fields)
        if payload:
            self._fail(f"a {cls.__name__} message carrying {len(payload)} payload bytes")
        return cls(**fields)


# ----------------------------------------------------------------------------- plain data


#: What ``run(..., plain_results=True)`` lets a rank return (containers may nest).
PLAIN_TYPES = "None, bool, int, float, str, bytes, torch tensors, and lists, tuples and dicts of these"
_SCALARS = (type(None), bool, int, float, str, bytes)


def find_unplain(value: Any) -> tuple[str, str] | None:
    """The first part of ``value`` that is not plain data, as ``(where, type name)``.

    ``where`` reads like an expression: ``"value[2]['loss']"``. ``None`` when all is plain.
    """
    import torch

    plain_tensors = (torch.Tensor, torch.nn.Parameter)
    stack, seen = [("value", value)], set()
    while stack:
        where, v = stack.pop()
        t = type(v)
        if t in _SCALARS or t in plain_tensors:
            continue
        if t in (list, tuple, dict):
            if id(v) in seen:
                continue
            seen.add(id(v))
            if t is dict:
                for k, item in reversed(list(v.items())):
                    if type(k) not in _SCALARS:
                        return f"a key of {where}", type_name(k)
                    stack.append((f"{where}[{k!r}]", item))
            else:
                stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(v))))
            continue
        return where, type_name(v)
    return None


def type_name(v: Any) -> str:
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def dump_plain(value: Any) -> bytes:
    """``value`` (plain data, see :func:`find_unplain`) as the bytes ``torch.save`` writes."""
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _why(e: Exception) -> str:
    """The telling line of torch.load's refusal (its first lines are the same for every one)."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    telling = [l for l in lines if not l.startswith(("Weights only load failed", "Check the doc",
                                                     "Please file an issue"))]
    return f"{type(e).__name__}: {(telling or lines or [''])[0]}"[:300]


def load_plain(payload: bytes) -> Any:
    """Read what :func:`dump_plain` wrote, running no code whatever the bytes are.

    Only torch's zip format is accepted (never its legacy pickle format), through
    ``torch.load(weights_only=True)``; the result must be plain data too.
    Raises ``ValueError`` saying what was wrong.
    """
    import warnings

    import torch

    if not payload.startswith(b"PK\x03\x04"):
        raise ValueError("it is not in torch.save's format")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any failure to read is reported the same way
        raise ValueError(f"torch.load(weights_only=True) refused it ({_why(e)})") from None
    bad = find_unplain(value)
    if bad is not None:
        raise ValueError(f"it holds a {bad[1]} at {bad[0]}, which is not plain data")
    return value
