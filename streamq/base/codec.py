"""Payload and result encoding: bytes, str or JSON values, never pickle.

A payload travels as two stream fields: a one-letter type (``b`` bytes,
``s`` UTF-8 text, ``j`` JSON) and the encoded bytes. A result is stored as
one value: the same type letter followed by the encoded bytes.
"""

from __future__ import annotations

import json
from typing import Any

from streamq.errors import PayloadError, PayloadTooLarge, ResultError

BYTES, TEXT, JSON = b"b", b"s", b"j"

# built once: json.dumps with options builds a new encoder on every call, and
# JSONEncoder.encode builds its C encoder on every call
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are not JSON: refused on the way in as on the way out
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_scan = _DECODER.scan_once  # type: ignore[attr-defined]
try:
    from json.encoder import (  # type: ignore[attr-defined]
        c_make_encoder,
        encode_basestring_ascii,
    )

    # no circular-reference markers: a circular value ends in RecursionError instead
    _c_encode = c_make_encoder(None, _ENCODER.default, encode_basestring_ascii, None,
                               ":", ",", False, False, False)
except (ImportError, TypeError):  # an interpreter without json's C accelerator
    _c_encode = None


def _dumps(value: Any) -> str:
    if _c_encode is None:
        try:
            return _ENCODER.encode(value)
        except RecursionError:
            raise ValueError("circular reference, or nested too deeply") from None
    try:
        return "".join(_c_encode(value, 0))
    except RecursionError:
        raise ValueError("circular reference, or nested too deeply") from None


def _loads(text: str) -> Any:
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        end = -1
    if end == len(text):
        return value
    return _DECODER.decode(text)  # whitespace around the value, or a clear error


def loads_json(text: str) -> Any:
    """A JSON text's value, as workers decode it: NaN and Infinity refused, and
    nesting deeper than the interpreter's recursion limit a ValueError too."""
    try:
        return _loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def encode(value: Any, max_bytes: int | None = None, *, what: str = "payload") -> tuple[bytes, bytes]:
    """Encode ``value`` as ``(type letter, data)``; raise PayloadError if it cannot be."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        kind, data = BYTES, bytes(value)
    elif isinstance(value, str):
        kind, data = TEXT, value.encode("utf-8", "surrogatepass")
    else:
        try:
            data = _dumps(value).encode()
        except (TypeError, ValueError) as e:
            raise PayloadError(
                f"{what} of type {type(value).__name__} is not bytes, str or JSON: {e}"
            ) from None
        kind = JSON
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadTooLarge(f"{what} is {len(data)} bytes, over the limit of {max_bytes} bytes")
    return kind, data


def decode(kind: bytes, data: bytes) -> Any:
    """Decode what :func:`encode` produced; raise PayloadError on malformed input."""
    if kind == BYTES:
        return data
    try:
        if kind == TEXT:
            return data.decode("utf-8", "surrogatepass")
        if kind == JSON:
            try:
                text = data.decode()  # UTF-8, as encode() writes it
            except UnicodeDecodeError:
                # UTF-16/32 JSON, or a clear error
                return json.loads(data, parse_constant=_no_constant)
            return _loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise PayloadError(f"malformed {kind.decode(errors='replace')} value: {e}") from None
    except RecursionError:
        raise PayloadError(f"malformed {kind.decode(errors='replace')} value: nested too "
                           "deeply") from None
    raise PayloadError(f"unknown value type {kind!r}")


def encode_result(value: Any) -> bytes:
    """Encode a handler's return value for the results hash."""
    if type(value) is dict or type(value) is list:  # the common case, without encode()'s checks
        try:
            return JSON + _dumps(value).encode()
        except (TypeError, ValueError):
            pass  # encode() says what is wrong
    try:
        kind, data = encode(value, what="result")
    except PayloadError as e:
        raise ResultError(f"{e} (the handler's return value cannot be stored: return "
                          "bytes, str or a JSON value)") from None
    return kind + data


def decode_result(raw: bytes) -> Any:
    """Decode a stored result."""
    return decode(raw[:1], raw[1:])
