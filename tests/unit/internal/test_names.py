"""Topic and channel names and Go's %q quoting of them in error texts."""

from __future__ import annotations

import pytest

from pynsqd.internal.names import EPHEMERAL_SUFFIX, go_quote, is_ephemeral, is_valid_name


@pytest.mark.parametrize(
    "name",
    [
        b"a",
        b".",
        b"-",
        b"_",
        b"Az09._-",
        b"x" * 64,
        b"a#ephemeral",
        b"x" * 54 + b"#ephemeral",  # 64 with the suffix
        b"..",
        b"ephemeral",
    ],
)
def test_valid(name: bytes) -> None:
    assert is_valid_name(name)
    assert is_valid_name(name.decode())


@pytest.mark.parametrize(
    "name",
    [
        b"",
        b"x" * 65,
        b"x" * 55 + b"#ephemeral",  # 65: the suffix counts
        b"#ephemeral",
        b"a#ephemeral#ephemeral",
        b"a#Ephemeral",
        b"a#ephem",
        b"a#",
        b"#",
        b"a b",
        b"a\t",
        b"a/b",
        b"a:b",
        b"a\x00",
        b"a\n",  # Python's "$" would match before a trailing newline; Go's does not
        b"a#ephemeral\n",
        b"\na",
        b"a\r",
        "caf\u00e9".encode(),
        b"\xff",
    ],
)
def test_invalid(name: bytes) -> None:
    assert not is_valid_name(name)
    assert not is_valid_name(name.decode("utf-8", "surrogateescape"))


def test_length_counts_bytes_of_str() -> None:
    assert not is_valid_name("\u00e9" * 32)  # 64 bytes, but not [.a-zA-Z0-9_-]
    assert is_valid_name("a" * 64)


def test_ephemeral() -> None:
    assert EPHEMERAL_SUFFIX == "#ephemeral"
    assert is_ephemeral("ch#ephemeral")
    assert not is_ephemeral("ch")
    assert not is_ephemeral("ch#ephemeral2")


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        (b"", '""'),
        (b"abc", '"abc"'),
        (b"a b", '"a b"'),
        (b'a"b', '"a\\"b"'),
        (b"a\\b", '"a\\\\b"'),
        (b"\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
        (b"\x00\x01\x1f\x7f", '"\\x00\\x01\\x1f\\x7f"'),
        (b"\xff", '"\\xff"'),  # invalid UTF-8: one \x per byte
        (b"a\xe2\x82", '"a\\xe2\\x82"'),  # truncated sequence
        (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # an encoded surrogate is invalid UTF-8
        (b"\xc0\xaf", '"\\xc0\\xaf"'),  # overlong
        ("caf\u00e9".encode(), '"caf\u00e9"'),  # printable runes stay as they are
        ("\u4e2d\U0001f600".encode(), '"\u4e2d\U0001f600"'),
        ("\ufffd".encode(), '"\ufffd"'),  # a real U+FFFD is printable
        ("\u00a0".encode(), '"\\u00a0"'),  # non-ASCII spaces are not
        ("\u3000".encode(), '"\\u3000"'),
        ("\u0085".encode(), '"\\u0085"'),  # C1 control
        ("\u200b\ufeff".encode(), '"\\u200b\\ufeff"'),  # format characters
        ("\ue000".encode(), '"\\ue000"'),  # private use
        ("\U000e0001".encode(), '"\\U000e0001"'),  # a format character above the BMP
        ("\U0010ffff".encode(), '"\\U0010ffff"'),  # unassigned
    ],
)
def test_go_quote(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted


def test_the_client_refuses_a_name_that_would_split_the_command_line() -> None:
    """Found by a new user (issue 41): ``to_nsq --topic='bad topic!'`` sent ``PUB bad
    topic!`` and nsqd published to ``bad``. The tools check every rule (and name the flag);
    the connections refuse what would break the framing and leave the rest to nsqd's code."""
    import pytest

    from pynsqd.client.errors import check_names

    with pytest.raises(ValueError, match="invalid topic name 'bad topic!'"):
        check_names("bad topic!", framing_only=True)
    with pytest.raises(ValueError, match="invalid channel name"):
        check_names("t", "c\nPUB x", framing_only=True)
    check_names("bad!topic", framing_only=True)  # nsqd answers E_BAD_TOPIC for this one
    with pytest.raises(ValueError, match="invalid topic name 'bad!topic'"):
        check_names("bad!topic")
    check_names("t#ephemeral", "c")
