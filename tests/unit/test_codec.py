from __future__ import annotations

import json
from typing import Any

import pytest

from streamq.base.codec import decode, decode_result, encode, encode_result
from streamq.base.models import Completion, JobState, completion_message
from streamq.errors import PayloadError, PayloadTooLarge


@pytest.mark.parametrize("value", [b"\x00\xff", "héllo", {"a": [1, 2.5, None]}, 7, None, [], ""])
def test_round_trip(value: Any) -> None:
    assert decode(*encode(value)) == value
    assert decode_result(encode_result(value)) == value


def test_types_are_kept_apart() -> None:
    assert encode("1")[0] != encode(1)[0] != encode(b"1")[0]


def test_errors() -> None:
    with pytest.raises(PayloadTooLarge, match="11 bytes, over the limit of 10"):
        encode("x" * 11, 10)
    with pytest.raises(PayloadError, match="not bytes, str or JSON"):
        encode({1, 2})
    with pytest.raises(PayloadError, match="malformed"):
        decode(b"j", b"{not json")
    with pytest.raises(PayloadError, match="unknown value type"):
        decode(b"p", b"\x80\x04")
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(PayloadError, match="circular"):
        encode(circular)
    with pytest.raises(PayloadError, match="not bytes, str or JSON"):
        encode(float("nan"))
    with pytest.raises(PayloadError, match="Extra data"):
        decode(b"j", b'{"a":1}x')


def test_json_from_other_writers_is_read_like_json_loads() -> None:
    # entries written by other producers: surrounding white space, UTF-16
    assert decode(b"j", b' {"a": [1, 2]}\n') == {"a": [1, 2]}
    assert decode(b"j", '{"a": "é"}'.encode("utf-16")) == {"a": "é"}
    assert encode({"k": "é", "n": [1.5, None]})[1] == b'{"k":"\\u00e9","n":[1.5,null]}'


@pytest.mark.parametrize("state", [s.value for s in JobState])
def test_completion_message_is_the_compact_json_of_the_completion(state: str) -> None:
    c = Completion("job-1.a:b_c", "queue-x", JobState(state), 10, 7, 3, 1_763_900_000_123)
    msg = completion_message(c.job_id, c.queue, state, 10, 7, 3, 1_763_900_000_123)
    assert msg == json.dumps(c.as_dict(), separators=(",", ":"))
    assert Completion.from_dict(json.loads(msg)) == c and c.message() == msg


def test_completion_message_refuses_an_unknown_state() -> None:
    with pytest.raises(ValueError, match="not a job state"):
        completion_message("j", "q", "done", 1, 1, 0, 1)
