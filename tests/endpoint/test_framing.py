"""Frame shapes and the incremental decoder (no threads, no sockets)."""

from __future__ import annotations

import msgpack
import pytest

from castor.endpoint.framing import (
    BadFrame,
    BadParams,
    FrameDecoder,
    FrameLimits,
    Notification,
    PendingFrame,
    Request,
    Response,
    UndecodableStream,
    encode_error_notification,
    encode_request,
    parse_frame,
)


def test_valid_frames_parse_to_named_tuples() -> None:
    assert parse_frame([0, 7, "echo", [{"a": 1}]]) == Request(7, "echo", {"a": 1})
    assert parse_frame([0, 7, "echo", []]) == Request(7, "echo", {})
    assert parse_frame([1, 7, None, {"ok": True}]) == Response(7, None, {"ok": True})
    assert parse_frame([1, 7, {"code": "timeout", "message": "m"}, None]).error["code"] == "timeout"
    assert parse_frame([2, "ui.notify", [{"text": "hi"}]]) == Notification("ui.notify", {"text": "hi"})


@pytest.mark.parametrize("value", [
    5, "x", None, {}, [], [3, 1, "m", []], [True, 1, "m", [{}]], [0, -1, "m", [{}]], [0, 2**32, "m", [{}]],
    [0, "id", "m", [{}]], [2, 5, [{}]], [2, "m"], [1, 1, "err", None], [1, "x", None, None], [1, 1, None],
])
def test_wrong_shapes_are_bad_frames(value) -> None:
    with pytest.raises(BadFrame) as info:
        parse_frame(value)
    assert info.value.code == "invalid_frame"


def test_bad_frame_keeps_a_valid_msgid_so_the_call_can_be_answered() -> None:
    with pytest.raises(BadFrame) as info:
        parse_frame([0, 42, 17, [{}]])
    assert info.value.msgid == 42
    with pytest.raises(BadFrame) as info:
        parse_frame([0, 43, "m"])
    assert info.value.msgid == 43


@pytest.mark.parametrize("params", [{"a": 1}, [1, 2], [{"a": 1}, {}], "x", None, [[1]]])
def test_params_must_be_one_map_in_an_array(params) -> None:
    with pytest.raises(BadParams) as info:
        parse_frame([0, 9, "echo", params])
    assert info.value.code == "invalid_params" and info.value.msgid == 9
    with pytest.raises(BadParams):
        parse_frame([2, "echo", params])


def test_decoder_yields_frames_split_across_chunks() -> None:
    data = encode_request(1, "a", {"x": "y" * 100}) + encode_request(2, "b", {})
    dec = FrameDecoder()
    values = []
    for i in range(0, len(data), 7):
        dec.feed(data[i:i + 7])
        while True:
            ok, value = dec.next_value()
            if not ok:
                break
            values.append(value)
    assert [v[1] for v in values] == [1, 2]


@pytest.mark.parametrize("payload", [
    b"\xc1",                                         # never-used byte
    msgpack.packb({"k": "v" * 200}),                 # str over max_str_len
    msgpack.packb(list(range(100))),                 # array over max_array_len
    msgpack.packb({str(i): i for i in range(100)}),  # map over max_map_len
    msgpack.packb({1: 2}),                           # non-string map key
])
def test_undecodable_or_over_limit_input_raises_undecodable(payload: bytes) -> None:
    dec = FrameDecoder(FrameLimits(max_str_len=64, max_array_len=50, max_map_len=50, max_buffer_size=4096))
    dec.feed(payload)
    with pytest.raises(UndecodableStream) as info:
        dec.next_value()
    assert info.value.code == "invalid_frame"


def test_the_decoder_buffers_a_frame_at_the_limit_and_one_read_more_but_no_further() -> None:
    # The connection bounds each frame to the limit itself; the decoder's buffer leaves room for
    # the read that ends such a frame and starts the next (RECV_CHUNK), and refuses past that.
    from castor.endpoint.transport import RECV_CHUNK

    dec = FrameDecoder(FrameLimits(max_buffer_size=1024))
    dec.feed(b"\xdb" + (1019).to_bytes(4, "big") + b"a" * 1019 + b"\xa1" + b"b" * (RECV_CHUNK - 8))
    assert dec.next_value() == (True, "a" * 1019)
    with pytest.raises(UndecodableStream):
        FrameDecoder(FrameLimits(max_buffer_size=1024)).feed(b"\xdb" + (RECV_CHUNK + 5000).to_bytes(4, "big")
                                                             + b"a" * (RECV_CHUNK + 1100))


def test_error_notification_shape() -> None:
    frame = msgpack.unpackb(encode_error_notification({"code": "invalid_frame", "message": "m"}))
    assert frame == [2, "error", [{"code": "invalid_frame", "message": "m"}]]


@pytest.mark.timeout(30)
def test_a_decoder_starts_small_and_grows_for_a_big_frame() -> None:
    """A connection's decoder does not take msgpack's default 1 MiB up front (a long-lived server
    opens one per connection: bench/longrun.py), and a frame far bigger than its first buffer
    still decodes."""
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoder = FrameDecoder()
        assert tracemalloc.get_traced_memory()[0] - before < 128 * 1024
    finally:
        tracemalloc.stop()
    big = "x" * (3 * 1024 * 1024)
    data = encode_request(1, "echo", {"s": big})
    for start in range(0, len(data), 60_000):
        decoder.feed(data[start:start + 60_000])
    ok, value = decoder.next_value()
    assert ok and parse_frame(value) == Request(1, "echo", {"s": big})


def test_a_value_nested_past_the_decoder_s_depth_says_so() -> None:
    """msgpack's decoder stops at 1,024 nested arrays and maps; castor's error read
    ``undecodable bytes: StackError: `` (msgpack's exception has no text), which told a peer nothing."""
    from castor.endpoint.framing import MAX_NESTING

    dec = FrameDecoder()
    dec.feed(b"\x91" * (MAX_NESTING - 1) + b"\x90")  # exactly MAX_NESTING containers
    assert dec.next_value()[0] is True
    deep = FrameDecoder()
    deep.feed(b"\x94\x00\x01\xa4echo\x91" + b"\x81\xa1a" * 10_000 + b"\x80")
    with pytest.raises(UndecodableStream) as info:
        deep.next_value()
    assert info.value.message == f"undecodable bytes: arrays and maps nested more than {MAX_NESTING} deep"


_SMALL = FrameLimits(max_str_len=64, max_bin_len=64, max_ext_len=8, max_array_len=50, max_map_len=50,
                     max_buffer_size=4096)


def _fed_in_pieces(frame: bytes, cut: int, limits: FrameLimits = _SMALL, max_frame: int = 4096,
                   ) -> tuple[str | None, int]:
    """Feed ``frame`` to a PendingFrame ``cut`` bytes at a time (after junk it must skip); the
    refusal and how many of the frame's bytes had arrived when it came."""
    junk = b"\x90" * 3  # whole frames read before it, in the same first read
    stream = junk + frame
    pending = PendingFrame(len(junk), limits)
    for end in range(len(junk) + cut, len(stream) + cut, cut):
        chunk_start = max(0, end - cut)
        why = pending.feed(stream[chunk_start:end], chunk_start, max_frame)
        if why is not None:
            return why, min(end, len(stream)) - len(junk)
    return None, len(frame)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", [1, 2, 3, 5, 64])
def test_a_pending_frame_within_the_limits_is_never_refused_however_its_bytes_arrive(cut: int) -> None:
    values = [
        [0, 1, "echo", [{"s": "x" * 64, "b": b"\x00" * 64, "n": [None, True, False, -1, -33, 2**63, -(2**63),
                                                             1.5, 0.25, 255, 65535, 2**32, "é" * 20]}]],
        [2, "ui.status", [{"m": {str(i): [i] * 3 for i in range(50)}, "e": msgpack.ExtType(5, b"12345678")}]],
        [1, 7, None, [msgpack.ExtType(1, b"a" * n) for n in (1, 2, 4, 8)] + [[[[]]], {}]],
        [0, 2, "x" * 31, [{"": "y" * 32}]],
    ]
    for value in values:
        frame = msgpack.packb(value, use_bin_type=True)
        assert _fed_in_pieces(frame, cut) == (None, len(frame)), value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", [1, 4, 4096])
@pytest.mark.parametrize(("marker", "kind", "size"), [
    (b"\xdb", "string", 2**32 - 1), (b"\xda", "string", 65), (b"\xd9", "string", 65),
    (b"\xc6", "binary", 2**31), (b"\xc5", "binary", 100), (b"\xc9", "ext", 9), (b"\xc7", "ext", 200),
    (b"\xdd", "array", 51), (b"\xdf", "map", 2**32 - 1),
])
def test_a_header_announcing_more_than_its_limit_is_refused_as_soon_as_it_is_read(
        marker: bytes, kind: str, size: int, cut: int) -> None:
    """A 4 GiB string was read until the frame limit's worth of it had arrived: now its header,
    the moment it is whole, refuses the frame -- whatever it was split across."""
    width = {b"\xd9": 1, b"\xc7": 1, b"\xda": 2, b"\xc5": 2}.get(marker, 4)
    header = marker + size.to_bytes(width, "big") + (b"\x05" if kind == "ext" else b"")
    before = b"\x94\x00\x01\xa4echo\x91\x81\xa1k"  # [0, 1, "echo", [{"k": <the element>
    frame = before + header + b"z" * 4096
    why, arrived = _fed_in_pieces(frame, cut)
    assert why is not None and f"a {kind} of {size} " in why, why
    assert arrived <= len(before) + len(header) + cut - 1 if cut < len(frame) else arrived == len(frame)


@pytest.mark.timeout(60)
def test_an_element_whose_end_would_lie_past_the_frame_limit_is_refused_at_its_header() -> None:
    limits = FrameLimits()  # a 7 MiB string is within the string limit, but not in a 1 MiB frame
    header = b"\x91\xdb" + (7 * 2**20).to_bytes(4, "big")
    why, arrived = _fed_in_pieces(header + b"z" * 100, 3, limits, max_frame=2**20)
    assert why is not None and "past the 1048576-byte frame limit" in why and arrived <= len(header) + 2


@pytest.mark.parametrize(("payload", "message"), [
    (b"\xc1", "undecodable bytes: not msgpack (a byte no msgpack value starts with)"),
    (b"\x94\x00\x01\xa4echo\x91\x81\xa2\xff\xfe\x90",
     "undecodable bytes: a string that is not UTF-8 (invalid start byte)"),
    (msgpack.packb([0, 1, "echo", [{1: 2}]]), "undecodable bytes: a map key that is not a string"),
])
def test_undecodable_input_is_named_in_castor_s_words(payload: bytes, message: str) -> None:
    """The peer reads why its connection was closed: ``0xc1`` read ``undecodable bytes: FormatError: ``
    (msgpack's exception has no text), a non-string key named the decoder's own option
    (``strict_map_key=True``) and bad UTF-8 Python's codec."""
    dec = FrameDecoder()
    dec.feed(payload)
    with pytest.raises(UndecodableStream) as info:
        dec.next_value()
    assert info.value.message == message
