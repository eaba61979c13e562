"""msgpack-rpc frames: shapes, encoding and incremental decoding.

Frames are msgpack arrays written back to back on a byte stream, with no
length prefix::

    request        [0, msgid, method, params]
    response       [1, msgid, error, result]
    notification   [2, method, params]

``params`` is a one-element array holding a map (an empty array is read as an
empty map). ``msgid`` is an unsigned 32-bit integer. ``error`` is ``nil`` or a
map ``{code, message, data?}``.

Decoding is split in two steps with different failure behaviour:

* :class:`FrameDecoder` turns bytes into msgpack values. Bytes that are not
  msgpack, or a value over the configured limits, leave the stream
  unsynchronised: it raises :class:`UndecodableStream` and the connection
  must be closed.
* :func:`parse_frame` checks the *shape* of one well-formed value. A wrong
  shape raises :class:`BadFrame`; the stream is still in sync, so the
  connection stays usable. ``BadFrame.msgid`` is set when the value looked
  like a request with a valid msgid, so the caller can answer that msgid
  instead of leaving the peer's call hanging.

Both errors are :class:`castor.messages.errors.InvalidFrame` (``invalid_frame``).
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import msgpack
from pydantic import BaseModel, ConfigDict, Field

from castor.endpoint.transport import RECV_CHUNK
from castor.messages.errors import InvalidFrame, InvalidParams

REQUEST = 0
RESPONSE = 1
NOTIFICATION = 2

MAX_MSGID = 2**32 - 1

#: Method name of the notification that reports a frame the peer cannot use.
ERROR_NOTIFICATION = "error"


class FrameLimits(BaseModel):
    """Decoder limits; anything over them is undecodable and closes the stream.

    The defaults allow 16 MiB frames, which is far above any legitimate castor
    message (prompts and artifacts are kilobytes), while bounding the memory a
    hostile peer can make one connection hold.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_buffer_size: int = Field(16 * 1024 * 1024, ge=1024)
    max_str_len: int = Field(8 * 1024 * 1024, ge=16)
    max_bin_len: int = Field(8 * 1024 * 1024, ge=16)
    max_array_len: int = Field(65_536, ge=8)
    max_map_len: int = Field(65_536, ge=8)
    max_ext_len: int = Field(1024, ge=0)

    @property
    def smallest(self) -> int:
        """The smallest size or element-count limit (castor never sends ext types)."""
        return min(self.max_buffer_size, self.max_str_len, self.max_bin_len, self.max_array_len, self.max_map_len)


class Request(NamedTuple):
    msgid: int
    method: str
    params: dict[str, Any]


class Response(NamedTuple):
    msgid: int
    error: dict[str, Any] | None
    result: Any


class Notification(NamedTuple):
    method: str
    params: dict[str, Any]


Frame = Request | Response | Notification


class UndecodableStream(InvalidFrame):
    """The byte stream cannot be decoded any further; close the connection."""


class BadFrame(InvalidFrame):
    """A well-formed msgpack value that is not a valid frame; the stream is in sync."""

    def __init__(self, message: str, *, msgid: int | None = None, method: str | None = None,
                 answers: tuple[int, Any] | None = None) -> None:
        super().__init__(message)
        self.msgid = msgid
        self.method = method
        #: ``(msgid, error)`` of a response whose error slot is not castor's map (a bare string, as
        #: many msgpack-rpc peers send): it still answers that call (see Connection._read_frame).
        self.answers = answers


class BadParams(InvalidParams):
    """A request or notification whose ``params`` is not ``[map]``; answered per msgid."""

    def __init__(self, message: str, *, msgid: int | None, method: str) -> None:
        super().__init__(message)
        self.msgid = msgid
        self.method = method


#: The unpacker's first buffer (msgpack's default is 1 MiB per connection, allocated up front); it
#: grows on demand up to ``max_buffer_size``, so a big frame still decodes.
READ_SIZE = 64 * 1024


class FrameDecoder:
    """Incremental decoder fed from ``os.read`` / ``sock.recv`` chunks.

    Never blocks: :meth:`feed` buffers bytes, :meth:`frames` yields each
    complete msgpack value. After :class:`UndecodableStream` the decoder is
    unusable (msgpack leaves its state undefined after an error).
    """

    __slots__ = ("unpacker",)

    def __init__(self, limits: FrameLimits | None = None) -> None:
        lim = limits or FrameLimits()
        #: The raw unpacker; the connection's hot path calls ``next()`` on it directly
        #: and converts failures with :func:`undecodable`.
        self.unpacker = msgpack.Unpacker(
            raw=False,
            use_list=True,
            strict_map_key=True,
            # Room for a whole frame at the limit and one read after it (a transport reads
            # RECV_CHUNK at most): the connection bounds each frame itself (its _frame_start),
            # so a frame just under the limit and the start of the next, read together, are not
            # refused as a buffer overflow.
            max_buffer_size=lim.max_buffer_size + RECV_CHUNK,
            read_size=min(READ_SIZE, lim.max_buffer_size),
            max_str_len=lim.max_str_len,
            max_bin_len=lim.max_bin_len,
            max_array_len=lim.max_array_len,
            max_map_len=lim.max_map_len,
            max_ext_len=lim.max_ext_len,
        )

    def feed(self, data: bytes) -> None:
        try:
            self.unpacker.feed(data)
        except msgpack.BufferFull as exc:
            raise UndecodableStream("frame exceeds the buffer limit") from exc

    def next_value(self) -> tuple[bool, Any]:
        """Return ``(True, value)`` for the next complete value, ``(False, None)`` if none yet."""
        try:
            return True, next(self.unpacker)
        except StopIteration:
            return False, None
        except Exception as exc:  # FormatError, StackError, ValueError (limits), UnicodeDecodeError…
            raise undecodable(exc) from exc


class PendingFrame:
    """Reads the headers of one frame whose bytes are still arriving, and refuses it as soon as a
    header announces more than the limits allow.

    msgpack's decoder checks an array's or a map's length at its header, but a string's, a
    binary's or an ext's only once the whole payload is buffered: a peer announcing a 4 GiB
    string was read until the frame limit (16 MiB) was buffered, however slowly it sent it. This
    walks the frame's structure as its bytes arrive -- headers only: a payload is passed over by
    arithmetic -- and says why the frame is refused the moment the header is read: an element
    over its own limit, or one whose end would lie past the frame limit.

    Fed only while a frame is incomplete (the decoder found no whole value in what is buffered),
    so a frame read whole costs nothing; its cost is one step per element header, never per byte,
    and it keeps at most a header's few bytes. The decoder has parsed every byte fed before it,
    so what it is fed is valid msgpack as far as it goes."""

    __slots__ = ("start", "pos", "_skip", "_stack", "_head", "_limits")

    def __init__(self, start: int, limits: FrameLimits) -> None:
        self.start = start  # the stream offset of the frame's first byte
        self.pos = start  # the stream offset of the next byte to look at
        self._skip = 0  # payload bytes still to pass over
        self._stack = [1]  # elements still to come, per open array or map (the frame: one value)
        self._head = b""  # the start of a header split across reads
        self._limits = limits

    def feed(self, data: bytes | memoryview, offset: int, max_frame: int) -> str | None:
        """Look at ``data``, the stream's bytes from ``offset`` on (any before :attr:`pos` were
        seen already); why the frame is refused, or None. ``max_frame``: the frame limit now (a
        connection's is tighter until it has authenticated)."""
        i = max(0, self.pos - offset)
        n = len(data)
        stack = self._stack
        while i < n and stack:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            head = self._head
            buf = head + bytes(data[i:i + _MAX_HEADER])
            parsed = self._header(buf)
            if parsed is None:  # a header cut by the end of what arrived: keep its start
                self._head = buf
                i = n
                break
            self._head = b""
            used, children, payload, why = parsed
            if why is not None:
                return why
            i += used - len(head)
            if payload and offset + i + payload - self.start > max_frame:
                return (f"an element announces {payload} bytes, which would end the frame past the "
                        f"{max_frame}-byte frame limit")
            stack[-1] -= 1
            if children:
                stack.append(children)
            else:
                self._skip = payload
                while stack and stack[-1] == 0:
                    stack.pop()
        self.pos = offset + i
        return None

    def _header(self, buf: bytes) -> tuple[int, int, int, str | None] | None:
        """The header at the start of ``buf``: (its length, the elements it opens, the payload
        bytes that follow it, why it is over the limits); None when ``buf`` holds only its start."""
        b = buf[0]
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):  # fixint, nil, booleans
            return 1, 0, 0, None
        if b <= 0x8F:
            return 1, 2 * (b & 0x0F), 0, None
        if b <= 0x9F:
            return 1, b & 0x0F, 0, None
        if b <= 0xBF:
            return 1, 0, b & 0x1F, None
        fixed = _FIXED.get(b)
        if fixed is not None:  # numbers and fixext: a marker (and an ext's type) then the payload
            return fixed
        spec = _SIZED.get(b)
        if spec is None:
            return 1, 0, 0, None  # 0xC1 (never used): the decoder refuses it itself
        kind, width, extra = spec
        if len(buf) < 1 + width + extra:
            return None
        size = int.from_bytes(buf[1:1 + width], "big")
        limit: int = getattr(self._limits, _LIMIT_OF[kind])
        why = None
        if size > limit:
            unit = "elements" if kind in ("array", "map") else "bytes"
            why = f"a {kind} of {size} {unit} announced, over the {limit}-{unit[:-1]} {kind} limit"
        if kind == "array":
            return 1 + width, size, 0, why
        if kind == "map":
            return 1 + width, 2 * size, 0, why
        return 1 + width + extra, 0, size, why


#: Which of FrameLimits' fields bounds each kind of sized element.
_LIMIT_OF = {"string": "max_str_len", "binary": "max_bin_len", "ext": "max_ext_len", "array": "max_array_len",
             "map": "max_map_len"}
#: The longest header: an ext32's marker, 4 length bytes and its type byte.
_MAX_HEADER = 6
#: Headers of a fixed size: marker -> (header length, 0, payload bytes, None).
_FIXED: dict[int, tuple[int, int, int, str | None]] = {
    0xCA: (1, 0, 4, None), 0xCB: (1, 0, 8, None),  # float 32/64
    0xCC: (1, 0, 1, None), 0xCD: (1, 0, 2, None), 0xCE: (1, 0, 4, None), 0xCF: (1, 0, 8, None),  # uint
    0xD0: (1, 0, 1, None), 0xD1: (1, 0, 2, None), 0xD2: (1, 0, 4, None), 0xD3: (1, 0, 8, None),  # int
    0xD4: (2, 0, 1, None), 0xD5: (2, 0, 2, None), 0xD6: (2, 0, 4, None), 0xD7: (2, 0, 8, None),  # fixext
    0xD8: (2, 0, 16, None),
}
#: Headers with a length: marker -> (kind, length bytes, bytes after the length: an ext's type).
_SIZED: dict[int, tuple[str, int, int]] = {
    0xC4: ("binary", 1, 0), 0xC5: ("binary", 2, 0), 0xC6: ("binary", 4, 0),
    0xC7: ("ext", 1, 1), 0xC8: ("ext", 2, 1), 0xC9: ("ext", 4, 1),
    0xD9: ("string", 1, 0), 0xDA: ("string", 2, 0), 0xDB: ("string", 4, 0),
    0xDC: ("array", 2, 0), 0xDD: ("array", 4, 0), 0xDE: ("map", 2, 0), 0xDF: ("map", 4, 0),
}


#: How deep msgpack's decoder nests arrays and maps (its fixed stack: the outermost counts); a value
#: nested deeper is undecodable, and its exception (``StackError``) carries no text of its own.
MAX_NESTING = 1024


def undecodable(exc: Exception) -> UndecodableStream:
    """The error for an exception raised by the unpacker (its state is undefined after it)."""
    if isinstance(exc, msgpack.StackError):
        return UndecodableStream(f"undecodable bytes: arrays and maps nested more than {MAX_NESTING} deep")
    if isinstance(exc, msgpack.FormatError):  # its text is empty: it told a peer nothing
        return UndecodableStream("undecodable bytes: not msgpack (a byte no msgpack value starts with)")
    if isinstance(exc, UnicodeDecodeError):
        return UndecodableStream(f"undecodable bytes: a string that is not UTF-8 ({exc.reason})")
    if isinstance(exc, ValueError) and "map key" in str(exc):
        return UndecodableStream("undecodable bytes: a map key that is not a string")
    return UndecodableStream(f"undecodable bytes: {type(exc).__name__}: {_short(exc)}")


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "…"


def _valid_msgid(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_MSGID


def _params_map(raw: Any, *, msgid: int | None, method: str) -> dict[str, Any]:
    if type(raw) is list:
        if len(raw) == 1 and type(raw[0]) is dict:
            return raw[0]
        if not raw:
            return {}
    raise BadParams("params must be a one-element array holding a map", msgid=msgid, method=method)


def parse_frame(value: Any) -> Frame:
    """Check the shape of one decoded value; raise :class:`BadFrame` / :class:`BadParams`.

    Kept to plain ``type()`` checks with the common case first: it runs on
    every frame (the hot path).
    """
    if type(value) is not list or not value:
        raise BadFrame("a frame must be a non-empty msgpack array")
    size = len(value)
    kind = value[0]
    if type(kind) is int:  # excludes bool
        if kind == REQUEST and size == 4:
            msgid, method, params = value[1], value[2], value[3]
            if type(msgid) is int and 0 <= msgid <= MAX_MSGID and type(method) is str and method:
                if type(params) is list and len(params) == 1 and type(params[0]) is dict:
                    return Request(msgid, method, params[0])
                return Request(msgid, method, _params_map(params, msgid=msgid, method=method))
        return _parse_slow(value, kind, size)
    raise BadFrame("frame type must be 0 (request), 1 (response) or 2 (notification)")


def _parse_slow(value: list[Any], kind: int, size: int) -> Frame:
    if kind == REQUEST:
        if size != 4:
            raise BadFrame("a request must have 4 elements",
                           msgid=value[1] if size > 1 and _valid_msgid(value[1]) else None)
        _, msgid, method, params = value
        if not _valid_msgid(msgid):
            raise BadFrame("request msgid must be an unsigned 32-bit integer")
        if type(method) is not str or not method:
            raise BadFrame("request method must be a non-empty string", msgid=msgid)
        return Request(msgid, method, _params_map(params, msgid=msgid, method=method))
    if kind == NOTIFICATION:
        if size != 3:
            raise BadFrame("a notification must have 3 elements")
        _, method, params = value
        if type(method) is not str or not method:
            raise BadFrame("notification method must be a non-empty string")
        return Notification(method, _params_map(params, msgid=None, method=method))
    if kind == RESPONSE:
        if size != 4:
            raise BadFrame("a response must have 4 elements")
        _, msgid, error, result = value
        if not _valid_msgid(msgid):
            raise BadFrame("response msgid must be an unsigned 32-bit integer")
        if error is not None and not (type(error) is dict and type(error.get("code")) is str):
            raise BadFrame("response error must be nil or a map with a string code", answers=(msgid, error))
        return Response(msgid, error, result)
    raise BadFrame("frame type must be 0 (request), 1 (response) or 2 (notification)")


# Encoding. ``use_bin_type`` keeps bytes and str distinct on the wire. One
# Packer per thread: ``msgpack.packb`` builds a new Packer on every call.
_local = threading.local()
#: Each thread's packer (``packers.packer``, made on a thread's first frame), for a caller that
#: packs a frame in its own frame as ``encode_request`` does: a packer that raised is replaced,
#: never used again (its buffer may hold half a frame).
packers = _local


def _pack(obj: Any) -> bytes:
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        packed: bytes = packer.pack(obj)
        return packed
    except BaseException:
        _local.packer = msgpack.Packer(use_bin_type=True)  # never reuse a half-written buffer
        raise


def over_limits(frame: bytes, obj: Any, limits: FrameLimits) -> str | None:
    """Why the peer's decoder (same limits as ours) would refuse ``frame`` — ``obj`` is what it
    encodes — or None. Free for ordinary frames: every limit is on a count of bytes or of
    elements, and each element takes at least a byte, so a frame no longer than the smallest
    limit cannot break any of them; only longer ones are walked."""
    if len(frame) <= limits.smallest:
        return None
    if len(frame) > limits.max_buffer_size:
        return f"the frame is {len(frame)} bytes, over the {limits.max_buffer_size}-byte frame limit"
    return element_over_limits(obj, limits)


def element_over_limits(obj: Any, limits: FrameLimits) -> str | None:
    """Why one of ``obj``'s strings, binaries, arrays or maps is over ``limits``, or None."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str) and len(value) * 4 > limits.max_str_len:  # cheap bound first
            size = len(value.encode("utf-8", "surrogatepass"))
            if size > limits.max_str_len:
                return f"a string of {size} bytes is over the {limits.max_str_len}-byte string limit"
        elif isinstance(value, (bytes, bytearray)) and len(value) > limits.max_bin_len:
            return f"a binary of {len(value)} bytes is over the {limits.max_bin_len}-byte limit"
        elif isinstance(value, (list, tuple)):
            if len(value) > limits.max_array_len:
                return f"an array of {len(value)} elements is over the {limits.max_array_len}-element limit"
            stack.extend(value)
        elif isinstance(value, dict):
            if len(value) > limits.max_map_len:
                return f"a map of {len(value)} entries is over the {limits.max_map_len}-entry limit"
            stack.extend(value.keys())
            stack.extend(value.values())
    return None


def encode_request(msgid: int, method: str, params: dict[str, Any]) -> bytes:
    # _pack's body, inlined: a request and a response are packed once per call each way.
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        packed: bytes = packer.pack([REQUEST, msgid, method, [params]])
        return packed
    except BaseException:
        _local.packer = msgpack.Packer(use_bin_type=True)  # never reuse a half-written buffer
        raise


def encode_response(msgid: int, error: dict[str, Any] | None, result: Any) -> bytes:
    try:  # _pack's body, inlined (see encode_request)
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    try:
        packed: bytes = packer.pack([RESPONSE, msgid, error, result])
        return packed
    except BaseException:
        _local.packer = msgpack.Packer(use_bin_type=True)  # never reuse a half-written buffer
        raise


def encode_notification(method: str, params: dict[str, Any]) -> bytes:
    return _pack([NOTIFICATION, method, [params]])


def encode_error_notification(error: dict[str, Any]) -> bytes:
    """The ``[2, "error", [{code, message, data?}]]`` frame for an unusable frame."""
    return encode_notification(ERROR_NOTIFICATION, error)
