"""nsqlookupd's V1 protocol, sans-IO: transcripts fed whole, byte by byte and with trailing data;
every error; the client-side encoders nsqd uses; fuzzing."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.internal.gotext import go_json
from pynsqd.protocol.errors import FatalClientError
from pynsqd.protocol.lookup import (
    Command,
    Identify,
    Ping,
    Register,
    ResponseReader,
    Unregister,
    V1Parser,
    encode_identify,
    encode_register,
    encode_response,
    encode_unregister,
    go_trim_space,
)

BODY = b'{"broadcast_address":"h","tcp_port":4150,"http_port":4151,"version":"1.3.0"}'
IDENT = Identify("h", 4150, 4151, "1.3.0")


def identify(body: bytes = BODY) -> bytes:
    return b"IDENTIFY\n" + struct.pack(">l", len(body)) + body


def run(data: bytes, *, mode: str = "whole", eof: bool = False) -> tuple[list[Command], str | None]:
    """Feed ``data`` (whole / bytewise); the commands and the first error's wire text."""
    parser = V1Parser()
    chunks = [data] if mode == "whole" else [data[i : i + 1] for i in range(len(data))]
    out: list[Command] = []
    try:
        for chunk in chunks:
            parser.feed(chunk)
            while (cmd := parser.next_command()) is not None:
                out.append(cmd)
        if eof:
            parser.feed_eof()
            while (cmd := parser.next_command()) is not None:
                out.append(cmd)
    except FatalClientError as err:
        return out, err.wire.decode("utf-8", "surrogateescape")
    return out, None


MODES = ["whole", "bytewise"]

TRANSCRIPTS: list[tuple[bytes, list[Command], str | None]] = [
    (b"  V1PING\n", [Ping()], None),
    (b"  V1PING extra args\n", [Ping()], None),
    (b"  V1 PING \r\n", [Ping()], None),  # TrimSpace
    (b"  V1\tPING\xc2\xa0\n", [Ping()], None),  # U+00A0 is Go whitespace
    (b"  V1" + identify(), [IDENT], None),
    (b"  V1" + identify() + b"REGISTER t\n", [IDENT, Register("t", "")], None),
    (b"  V1" + identify() + b"REGISTER t c\n", [IDENT, Register("t", "c")], None),
    (b"  V1" + identify() + b"REGISTER t c extra\n", [IDENT, Register("t", "c")], None),
    (b"  V1" + identify() + b"UNREGISTER t c\n", [IDENT, Unregister("t", "c")], None),
    (b"  V1" + identify() + b"UNREGISTER t\n", [IDENT, Unregister("t", "")], None),
    (
        b"  V1" + identify() + b"REGISTER t#ephemeral c#ephemeral\n",
        [IDENT, Register("t#ephemeral", "c#ephemeral")],
        None,
    ),
    # errors, all fatal
    (b"  V2PING\n", [], "E_BAD_PROTOCOL"),
    (b"XXXX", [], "E_BAD_PROTOCOL"),
    (b"  V1FOO\n", [], "E_INVALID invalid command FOO"),
    (b"  V1\n", [], "E_INVALID invalid command "),
    (b"  V1ping\n", [], "E_INVALID invalid command ping"),
    (b"  V1REGISTER t\n", [], "E_INVALID client must IDENTIFY"),
    (b"  V1UNREGISTER t c\n", [], "E_INVALID client must IDENTIFY"),
    (b"  V1PING\nREGISTER t\n", [Ping()], "E_INVALID client must IDENTIFY"),
    (
        b"  V1" + identify() + b"REGISTER\n",
        [IDENT],
        "E_INVALID REGISTER insufficient number of params",
    ),
    (
        b"  V1" + identify() + b"REGISTER \n",
        [IDENT],
        "E_INVALID REGISTER insufficient number of params",
    ),
    (
        b"  V1" + identify() + b"UNREGISTER\n",
        [IDENT],
        "E_INVALID UNREGISTER insufficient number of params",
    ),
    (
        b"  V1" + identify() + b"REGISTER a$b\n",
        [IDENT],
        "E_BAD_TOPIC REGISTER topic name 'a$b' is not valid",
    ),
    (
        b"  V1" + identify() + b"REGISTER  t\n",
        [IDENT],
        "E_BAD_TOPIC REGISTER topic name '' is not valid",
    ),
    (
        b"  V1" + identify() + b"UNREGISTER " + b"x" * 65 + b"\n",
        [IDENT],
        "E_BAD_TOPIC UNREGISTER topic name '" + "x" * 65 + "' is not valid",
    ),
    (
        b"  V1" + identify() + b"REGISTER t c!\n",
        [IDENT],
        "E_BAD_CHANNEL REGISTER channel name 'c!' is not valid",
    ),
    (
        b"  V1" + identify() + b"UNREGISTER t c\xff\n",
        [IDENT],
        "E_BAD_CHANNEL UNREGISTER channel name 'c\udcff' is not valid",
    ),
    (b"  V1" + identify() + identify(), [IDENT], "E_INVALID cannot IDENTIFY again"),
    (b"  V1" + identify(b"{}"), [], "E_BAD_BODY IDENTIFY missing fields"),
    (b"  V1" + identify(b"null"), [], "E_BAD_BODY IDENTIFY missing fields"),
    (
        b"  V1" + identify(b'{"broadcast_address":"h","tcp_port":1,"http_port":2}'),
        [],
        "E_BAD_BODY IDENTIFY missing fields",
    ),
    (
        b"  V1" + identify(b'{"broadcast_address":"h","tcp_port":0,"http_port":2,"version":"v"}'),
        [],
        "E_BAD_BODY IDENTIFY missing fields",
    ),
    (b"  V1" + identify(b"{not json"), [], "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"  V1" + identify(b"[]"), [], "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (
        b"  V1" + identify(b'{"tcp_port":"4150"}'),
        [],
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    (
        b"  V1" + identify(b'{"tcp_port":4150.5}'),
        [],
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    (b"  V1" + identify(b'{"version":1}'), [], "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"  V1IDENTIFY\n\xff\xff\xff\xff", [], "E_BAD_BODY IDENTIFY failed to read body"),
    (b"  V1IDENTIFY\n\x7f\xff\xff\xff", [], "E_BAD_BODY IDENTIFY failed to read body"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("data", "commands", "error"), TRANSCRIPTS)
def test_transcript(data: bytes, commands: list[Command], error: str | None, mode: str) -> None:
    assert run(data, mode=mode) == (commands, error)


@pytest.mark.parametrize(("data", "commands", "error"), TRANSCRIPTS)
def test_transcript_with_trailing_data(
    data: bytes, commands: list[Command], error: str | None
) -> None:
    # Trailing bytes never change what came before; after an error nothing more is read.
    got, got_error = run(data + b"PING\nPI")
    if error is None:
        assert got == [*commands, Ping()]
        assert got_error is None
    else:
        assert (got, got_error) == (commands, error)


def test_identify_go_json_quirks() -> None:
    # keys match case-insensitively, the last repeat wins, unknown keys and nulls are skipped,
    # remote_address from the body is decoded but not used
    body = (
        b'{"BROADCAST_ADDRESS":"a","broadcast_address":"b","Tcp_Port":1,"http_port":2,'
        b'"version":"v","hostname":null,"extra":[1],"remote_address":"x",'
        b'"topology_zone":"z","topology_region":"r"}'
    )
    assert run(b"  V1" + identify(body)) == ([Identify("b", 1, 2, "v", "", "z", "r")], None)


def test_short_reads_at_eof() -> None:
    assert run(b"  V1IDENTIFY\n\x00\x00", eof=True) == (
        [],
        "E_BAD_BODY IDENTIFY failed to read body size",
    )
    assert run(b"  V1IDENTIFY\n\x00\x00\x00\x10{}", eof=True) == (
        [],
        "E_BAD_BODY IDENTIFY failed to read body",
    )
    # a half line at EOF is dropped, as Go's ReadString drops it
    assert run(b"  V1PING\nPIN", eof=True) == ([Ping()], None)
    assert run(b"  V", eof=True) == ([], None)


def test_line_too_long() -> None:
    parser = V1Parser(max_line_length=100)
    parser.feed(b"  V1" + b"x" * 101)
    with pytest.raises(FatalClientError) as e:
        parser.next_command()
    assert e.value.code == "E_INVALID"
    with pytest.raises(FatalClientError):  # stays failed
        parser.next_command()


def test_identified_flag() -> None:
    parser = V1Parser()
    parser.feed(b"  V1" + identify())
    assert not parser.identified
    assert parser.next_command() == IDENT
    assert parser.identified


def test_go_trim_space() -> None:
    assert go_trim_space(b" \t\r\x0b\x0cA B\xe3\x80\x80") == "A B"
    assert go_trim_space(b"\x1cA") == "\x1cA"  # Python strips \x1c, Go does not


# -- the client side ------------------------------------------------------------------------------


def test_encoders_are_go_nsq_bytes() -> None:
    assert encode_register("t") == b"REGISTER t\n"
    assert encode_register("t", "c") == b"REGISTER t c\n"
    assert encode_unregister("t") == b"UNREGISTER t\n"
    assert encode_unregister("t", "c") == b"UNREGISTER t c\n"
    assert encode_response(b"OK") == b"\x00\x00\x00\x02OK"
    data = {"version": "1.3.0", "tcp_port": 1, "http_port": 2, "hostname": "h<&>"}
    body = b'{"hostname":"h\\u003c\\u0026\\u003e","http_port":2,"tcp_port":1,"version":"1.3.0"}'
    assert go_json(data, sort_keys=True) == body
    assert encode_identify(data) == b"IDENTIFY\n" + struct.pack(">l", len(body)) + body
    assert go_json({"a": "\u2028é"}) == '{"a":"\\u2028é"}'.encode()


def test_response_reader() -> None:
    reader = ResponseReader(max_size=10)
    data = encode_response(b"OK") + encode_response(b"") + encode_response(b"0123456789")
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
        if i < len(data) - 1:
            assert len(reader.responses()) <= 2
    reader = ResponseReader(max_size=10)
    reader.feed(data)
    assert reader.responses() == [b"OK", b"", b"0123456789"]
    reader.feed(encode_response(b"x" * 11))
    with pytest.raises(ValueError):
        reader.responses()


def test_identify_round_trip_through_our_parser() -> None:
    data = {
        "version": "1.3.0",
        "tcp_port": 4150,
        "http_port": 4151,
        "hostname": "host",
        "broadcast_address": "b",
        "topology_zone": "z",
        "topology_region": "r",
    }
    assert json.loads(encode_identify(data)[13:]) == data
    assert run(b"  V1" + encode_identify(data)) == (
        [Identify("b", 4150, 4151, "1.3.0", "host", "z", "r")],
        None,
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_fuzz_only_protocol_errors(data: bytes, with_magic: bool) -> None:
    parser = V1Parser()
    parser.feed((b"  V1" if with_magic else b"") + data)
    try:
        for _ in range(1000):
            if parser.next_command() is None:
                break
        parser.feed_eof()
        while parser.next_command() is not None:
            pass
    except FatalClientError:
        pass
