from __future__ import annotations

from typing import Any

import pytest

from streamq.codec import decode, decode_result, encode, encode_result
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
