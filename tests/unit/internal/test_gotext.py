"""Go's ``encoding/json`` output, as every JSON answer (HTTP, AUTH, lookupd) is written."""

from __future__ import annotations

import json

from pynsqd.internal.gotext import go_json


def test_compact_and_html_escaped_as_go() -> None:
    assert go_json({"a": "<&>", "b": [1, 2]}) == b'{"a":"\\u003c\\u0026\\u003e","b":[1,2]}'


def test_line_and_paragraph_separators_are_escaped() -> None:
    # Go escapes U+2028/U+2029 so the output is safe inside JavaScript.
    assert go_json({"s": "a\u2028b\u2029"}) == b'{"s":"a\\u2028b\\u2029"}'


def test_non_ascii_is_written_as_utf8() -> None:
    assert go_json({"s": "é"}) == '{"s":"é"}'.encode()


def test_struct_order_unless_a_go_map() -> None:
    assert go_json({"b": 1, "a": 2}) == b'{"b":1,"a":2}'
    assert go_json({"b": 1, "a": 2}, sort_keys=True) == b'{"a":2,"b":1}'


def test_a_lone_surrogate_becomes_the_replacement_character() -> None:
    # An auth server may answer {"identity": "\ud800"}: json.loads gives a lone surrogate,
    # which cannot be encoded as UTF-8. Go writes U+FFFD; we must not fail the response.
    identity = json.loads('"x\\ud800y"')
    assert go_json({"identity": identity}) == '{"identity":"x\ufffdy"}'.encode()
