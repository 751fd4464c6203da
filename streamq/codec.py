"""Payload and result encoding: bytes, str or JSON values, never pickle.

A payload travels as two stream fields: a one-letter type (``b`` bytes,
``s`` UTF-8 text, ``j`` JSON) and the encoded bytes. A result is stored as
one value: the same type letter followed by the encoded bytes.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import PayloadError, PayloadTooLarge

BYTES, TEXT, JSON = b"b", b"s", b"j"

# built once: json.dumps with options builds a new encoder on every call
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()


def encode(value: Any, max_bytes: int | None = None, *, what: str = "payload") -> tuple[bytes, bytes]:
    """Encode ``value`` as ``(type letter, data)``; raise PayloadError if it cannot be."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        kind, data = BYTES, bytes(value)
    elif isinstance(value, str):
        kind, data = TEXT, value.encode("utf-8", "surrogatepass")
    else:
        try:
            data = _ENCODER.encode(value).encode()
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
                return json.loads(data)  # UTF-16/32 JSON, or a clear error
            return _DECODER.decode(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise PayloadError(f"malformed {kind.decode(errors='replace')} value: {e}") from None
    raise PayloadError(f"unknown value type {kind!r}")


def encode_result(value: Any) -> bytes:
    """Encode a handler's return value for the results hash."""
    kind, data = encode(value, what="result")
    return kind + data


def decode_result(raw: bytes) -> Any:
    """Decode a stored result."""
    return decode(raw[:1], raw[1:])
