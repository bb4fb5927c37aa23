"""IDENTIFY bodies: §1.4 boundaries, and json.Unmarshal's behaviour into identifyDataV2."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pynsqd.protocol.commands import IdentifyData
from pynsqd.protocol.errors import FatalClientError
from pynsqd.protocol.identify import ProtocolConfig, parse_identify

CFG = ProtocolConfig()
DECODE_FAILED = "E_BAD_BODY IDENTIFY failed to decode JSON body"


def identify(body: bytes | dict[str, Any], config: ProtocolConfig = CFG) -> IdentifyData:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return parse_identify(raw, config)


def rejected(body: bytes | dict[str, Any], config: ProtocolConfig = CFG) -> str:
    with pytest.raises(FatalClientError) as info:
        identify(body, config)
    assert info.value.fatal
    assert info.value.code == "E_BAD_BODY"
    return info.value.wire.decode()


def test_defaults() -> None:
    data = identify({})
    assert data == IdentifyData(
        client_id="",
        hostname="",
        user_agent="",
        heartbeat_interval_ms=30_000,
        output_buffer_size=16 * 1024,
        output_buffer_timeout_ms=250,
        sample_rate=0,
        msg_timeout_ms=60_000,
        feature_negotiation=False,
        tls_v1=False,
        snappy=False,
        deflate=False,
        deflate_level=0,
        topology_region="",
        topology_zone="",
    )


def test_every_field() -> None:
    data = identify(
        {
            "client_id": "cid",
            "hostname": "host",
            "user_agent": "go-nsq/1.1.0",
            "heartbeat_interval": 5000,
            "output_buffer_size": 100,
            "output_buffer_timeout": 50,
            "sample_rate": 42,
            "msg_timeout": 2000,
            "feature_negotiation": True,
            "tls_v1": True,
            "snappy": True,
            "deflate": True,
            "deflate_level": 10,  # capped later by the server, never an error
            "topology_region": "r",
            "topology_zone": "z",
        }
    )
    assert data.client_id == "cid" and data.hostname == "host"
    assert data.user_agent == "go-nsq/1.1.0"
    assert (data.heartbeat_interval_ms, data.output_buffer_size) == (5000, 100)
    assert (data.output_buffer_timeout_ms, data.sample_rate, data.msg_timeout_ms) == (50, 42, 2000)
    assert data.feature_negotiation and data.tls_v1 and data.snappy and data.deflate
    assert data.deflate_level == 10
    assert (data.topology_region, data.topology_zone) == ("r", "z")


# -- field boundaries (§1.4), nsqd's default limits ------------------------------------------------

HB = "heartbeat interval ({}) is invalid"
OBS = "output buffer size ({}) is invalid"
OBT = "output buffer timeout ({}) is invalid"
SR = "sample rate ({}) is invalid"
MT = "msg timeout ({}) is invalid"


@pytest.mark.parametrize(
    ("field", "value", "attr", "effective"),
    [
        ("heartbeat_interval", -1, "heartbeat_interval_ms", 0),  # disabled
        ("heartbeat_interval", 0, "heartbeat_interval_ms", 30_000),  # default
        ("heartbeat_interval", 1000, "heartbeat_interval_ms", 1000),
        ("heartbeat_interval", 60_000, "heartbeat_interval_ms", 60_000),
        ("output_buffer_size", 0, "output_buffer_size", 16 * 1024),
        ("output_buffer_size", 64, "output_buffer_size", 64),
        ("output_buffer_size", 65536, "output_buffer_size", 65536),
        ("output_buffer_size", -1, "output_buffer_size", 1),
        ("output_buffer_timeout", -1, "output_buffer_timeout_ms", 0),
        ("output_buffer_timeout", 0, "output_buffer_timeout_ms", 250),
        ("output_buffer_timeout", 25, "output_buffer_timeout_ms", 25),
        ("output_buffer_timeout", 30_000, "output_buffer_timeout_ms", 30_000),
        ("sample_rate", 0, "sample_rate", 0),
        ("sample_rate", 99, "sample_rate", 99),
        ("msg_timeout", 0, "msg_timeout_ms", 60_000),
        ("msg_timeout", 1000, "msg_timeout_ms", 1000),
        ("msg_timeout", 900_000, "msg_timeout_ms", 900_000),
    ],
)
def test_accepted(field: str, value: int, attr: str, effective: int) -> None:
    assert getattr(identify({field: value}), attr) == effective


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("heartbeat_interval", -2, HB),
        ("heartbeat_interval", 1, HB),
        ("heartbeat_interval", 999, HB),
        ("heartbeat_interval", 60_001, HB),
        ("heartbeat_interval", 300_001, HB),  # nsqd/protocol_v2_test.go:436
        ("heartbeat_interval", 2**63 - 1, HB),  # an int64 decodes; the range check fails
        ("heartbeat_interval", -(2**63), HB),
        ("output_buffer_size", -2, OBS),
        ("output_buffer_size", 1, OBS),
        ("output_buffer_size", 63, OBS),
        ("output_buffer_size", 65537, OBS),
        ("output_buffer_timeout", -2, OBT),
        ("output_buffer_timeout", 1, OBT),  # the spec's 1 ms minimum is outdated: nsqd's is 25 ms
        ("output_buffer_timeout", 24, OBT),
        ("output_buffer_timeout", 30_001, OBT),
        ("sample_rate", -1, SR),
        ("sample_rate", 100, SR),
        ("sample_rate", 2**31 - 1, SR),
        ("msg_timeout", -1, MT),
        ("msg_timeout", 999, MT),
        ("msg_timeout", 900_001, MT),
    ],
)
def test_rejected(field: str, value: int, reason: str) -> None:
    assert rejected({field: value}) == "E_BAD_BODY IDENTIFY " + reason.format(value)


def test_output_buffer_size_minus_one_also_disables_the_timer() -> None:
    data = identify({"output_buffer_size": -1, "output_buffer_timeout": 100})
    assert (data.output_buffer_size, data.output_buffer_timeout_ms) == (1, 0)


def test_check_order_is_nsqds() -> None:
    # Identify(): heartbeat, then SetOutputBuffer (timeout before size), sample rate, msg timeout.
    everything_bad = {
        "heartbeat_interval": 1,
        "output_buffer_size": 1,
        "output_buffer_timeout": 2,
        "sample_rate": 100,
        "msg_timeout": 3,
    }
    assert rejected(everything_bad) == "E_BAD_BODY IDENTIFY " + HB.format(1)
    del everything_bad["heartbeat_interval"]
    assert rejected(everything_bad) == "E_BAD_BODY IDENTIFY " + OBT.format(2)
    del everything_bad["output_buffer_timeout"]
    assert rejected(everything_bad) == "E_BAD_BODY IDENTIFY " + OBS.format(1)
    del everything_bad["output_buffer_size"]
    assert rejected(everything_bad) == "E_BAD_BODY IDENTIFY " + SR.format(100)
    del everything_bad["sample_rate"]
    assert rejected(everything_bad) == "E_BAD_BODY IDENTIFY " + MT.format(3)


def test_limits_come_from_the_config() -> None:
    config = ProtocolConfig(
        heartbeat_interval_ms=7000,
        max_heartbeat_interval_ms=8000,
        output_buffer_size=200,
        max_output_buffer_size=300,
        output_buffer_timeout_ms=40,
        min_output_buffer_timeout_ms=30,
        max_output_buffer_timeout_ms=60,
        msg_timeout_ms=5000,
        max_msg_timeout_ms=6000,
    )
    data = identify({}, config)
    assert data.heartbeat_interval_ms == 7000
    assert (data.output_buffer_size, data.output_buffer_timeout_ms) == (200, 40)
    assert data.msg_timeout_ms == 5000
    assert identify({"heartbeat_interval": 8000}, config).heartbeat_interval_ms == 8000
    assert rejected({"heartbeat_interval": 8001}, config).endswith(HB.format(8001))
    assert identify({"output_buffer_size": 300}, config).output_buffer_size == 300
    assert rejected({"output_buffer_size": 301}, config).endswith(OBS.format(301))
    assert identify({"output_buffer_timeout": 30}, config).output_buffer_timeout_ms == 30
    assert rejected({"output_buffer_timeout": 29}, config).endswith(OBT.format(29))
    assert rejected({"output_buffer_timeout": 61}, config).endswith(OBT.format(61))
    assert identify({"msg_timeout": 6000}, config).msg_timeout_ms == 6000
    assert rejected({"msg_timeout": 6001}, config).endswith(MT.format(6001))


# -- how Go's encoding/json decodes into the struct ------------------------------------------


@pytest.mark.parametrize(
    ("body", "attr", "value"),
    [
        pytest.param(b"null", "client_id", "", id="top-level null is the zero struct"),
        pytest.param(b' \t\r\n{"client_id":"a"} \n', "client_id", "a", id="whitespace"),
        pytest.param(b'{"CLIENT_ID":"a"}', "client_id", "a", id="keys match case-insensitively"),
        pytest.param(b'{"Sample_Rate":5}', "sample_rate", 5, id="mixed case"),
        pytest.param('{"\u017fample_rate":5}'.encode(), "sample_rate", 5, id="long s folds to s"),
        pytest.param(
            '{"tls_v1":false,"\u212aey":1,"dee\u212a":2,"TLS_V1":true}'.encode(),
            "tls_v1",
            True,
            id="kelvin sign is not a field",
        ),
        pytest.param(
            '{"snappy":false,"snappy_\u212a":true}'.encode(),
            "snappy",
            False,
            id="kelvin unknown key ignored",
        ),
        pytest.param(
            b'{"client_id":"a","CLIENT_ID":"b","client_id":"c"}',
            "client_id",
            "c",
            id="repeated keys: the last one wins, in document order",
        ),
        pytest.param(
            b'{"client_id":"a","client_id":null}', "client_id", "a", id="null leaves the field"
        ),
        pytest.param(b'{"sample_rate":null}', "sample_rate", 0, id="null int"),
        pytest.param(b'{"heartbeat_interval":-0}', "heartbeat_interval_ms", 30_000, id="-0"),
        pytest.param(
            b'{"unknown":{"deep":[1,2.5,"x",null,true,{"a":[]}]},"client_id":"a"}',
            "client_id",
            "a",
            id="unknown keys of any type are skipped",
        ),
        pytest.param(
            b'{"unknown":' + b"9" * 5000 + b',"client_id":"a"}',
            "client_id",
            "a",
            id="a huge number in an unknown key is skipped",
        ),
        pytest.param(
            b'{"unknown":1e999,"client_id":"a"}', "client_id", "a", id="huge float skipped"
        ),
        pytest.param(
            b'{"client_id":"a\xffb\xe2\x82c"}',
            "client_id",
            "a\ufffdb\ufffd\ufffdc",
            id="invalid utf-8 in a string: U+FFFD per byte",
        ),
        pytest.param(
            b'{"client_id":"\xed\xa0\x80"}',
            "client_id",
            "\ufffd\ufffd\ufffd",
            id="an encoded surrogate is three invalid bytes",
        ),
        pytest.param(
            b'{"client_id":"\\ud800x\\udc00"}',
            "client_id",
            "\ufffdx\ufffd",
            id="lone surrogate escapes: U+FFFD",
        ),
        pytest.param(
            b'{"client_id":"\\ud83d\\ude00"}', "client_id", "\U0001f600", id="surrogate pair"
        ),
        pytest.param(
            '{"hostname":"h\u00e9\u4e2d"}'.encode(), "hostname", "h\u00e9\u4e2d", id="utf-8"
        ),
        pytest.param(b'{"deflate_level":-5}', "deflate_level", -5, id="any int deflate_level"),
        pytest.param(
            b'{"sample_rate":2147483647,"sample_rate":7}', "sample_rate", 7, id="int32 max, last"
        ),
    ],
)
def test_go_json_accepts(body: bytes, attr: str, value: Any) -> None:
    assert getattr(identify(body), attr) == value


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"   ", id="only whitespace"),
        pytest.param(b"{", id="truncated"),
        pytest.param(b"{} {}", id="trailing value"),
        pytest.param(b"{}x", id="trailing garbage"),
        pytest.param(b"[]", id="array"),
        pytest.param(b'"x"', id="string"),
        pytest.param(b"1", id="number"),
        pytest.param(b"true", id="bool"),
        pytest.param(b'{"a":NaN}', id="NaN"),
        pytest.param(b'{"a":Infinity}', id="Infinity"),
        pytest.param(b'{"a":-Infinity}', id="-Infinity"),
        pytest.param(b"\xef\xbb\xbf{}", id="utf-8 BOM"),
        pytest.param("{}".encode("utf-16"), id="utf-16"),
        pytest.param("{}".encode("utf-32-le"), id="utf-32"),
        pytest.param(b'{"a":1,}', id="trailing comma"),
        pytest.param(b"{'a':1}", id="single quotes"),
        pytest.param(b'{"a":01}', id="leading zero"),
        pytest.param(b'{"a":"\x01"}', id="raw control character"),
        pytest.param(b'{"a":1}\xff', id="invalid utf-8 outside strings"),
        pytest.param(b'{"client_id":1}', id="number for a string"),
        pytest.param(b'{"client_id":true}', id="bool for a string"),
        pytest.param(b'{"client_id":["a"]}', id="array for a string"),
        pytest.param(b'{"hostname":{}}', id="object for a string"),
        pytest.param(b'{"heartbeat_interval":"1000"}', id="string for an int"),
        pytest.param(b'{"heartbeat_interval":1000.0}', id="1000.0 for an int"),
        pytest.param(b'{"heartbeat_interval":1e3}', id="1e3 for an int"),
        pytest.param(b'{"heartbeat_interval":true}', id="bool for an int"),
        pytest.param(b'{"heartbeat_interval":9223372036854775808}', id="over int64"),
        pytest.param(b'{"heartbeat_interval":-9223372036854775809}', id="under int64"),
        pytest.param(b'{"msg_timeout":' + b"9" * 30 + b"}", id="30 digits"),
        pytest.param(b'{"msg_timeout":' + b"9" * 5000 + b"}", id="5000 digits"),
        pytest.param(b'{"sample_rate":2147483648}', id="over int32"),
        pytest.param(b'{"sample_rate":-2147483649}', id="under int32"),
        pytest.param(b'{"feature_negotiation":1}', id="int for a bool"),
        pytest.param(b'{"tls_v1":"true"}', id="string for a bool"),
        pytest.param(b'{"TLS_V1":"true"}', id="folded key still type-checked"),
        pytest.param(b'{"sample_rate":5,"SAMPLE_RATE":"x"}', id="a later bad duplicate"),
    ],
)
def test_go_json_rejects(body: bytes) -> None:
    assert rejected(body) == DECODE_FAILED


def test_strings_are_always_encodable() -> None:
    # A client_id ends up in logs and /stats: it must never carry a lone surrogate.
    data = identify(b'{"client_id":"\\udfff\xc3","hostname":"\xff","user_agent":"\\ud800"}')
    for text in (data.client_id, data.hostname, data.user_agent):
        text.encode("utf-8")
        assert "\ufffd" in text


@pytest.mark.parametrize("value", ["yes", "true", 1, 0, None, [], {}])
def test_idempotent_publish_of_another_type_is_refused_not_ignored(value: Any) -> None:
    """pynsqd's own key: a client that asks for idempotent publishing in any form but a JSON
    boolean is told so (nsqd's E_BAD_BODY, as for its own boolean keys) rather than left
    without it, which would write its retries twice (issue 56)."""
    assert rejected({"idempotent_publish": value}) == DECODE_FAILED


@pytest.mark.parametrize("value", [True, False])
def test_idempotent_publish_as_a_boolean_is_taken(value: bool) -> None:
    assert identify({"idempotent_publish": value}).idempotent_publish is value
