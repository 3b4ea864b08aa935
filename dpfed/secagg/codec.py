"""Deterministic, strict byte encoding shared by every secure-aggregation message.

One concept: a canonical length-prefixed encoding. Each field is written in a fixed order as

- ``u8``/``u32``/``u64``: unsigned little-endian integers of 1, 4, 8 bytes;
- ``blob``: ``u32`` length then the bytes (strings are UTF-8 blobs);
- ``fixed(n)``: exactly ``n`` bytes, no length.

``Reader`` is the exact inverse and refuses anything else: short input, lengths over the stated
limits, invalid UTF-8, trailing bytes. Because there is one encoding per value, the bytes that
are signed or authenticated (``dpfed.secagg.messages``) are the bytes that are parsed, and two
parties that agree on a value agree on its bytes (needed for signatures over re-encoded
messages). No protobuf here: the messages travel as opaque ``bytes`` inside the project's
signed envelopes.
"""

from __future__ import annotations

import struct

from dpfed.secagg.errors import MalformedMessage

__all__ = ["Writer", "Reader", "MAX_ID_BYTES"]

#: Longest site id or round id accepted (bytes of UTF-8).
MAX_ID_BYTES = 256

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Writer:
    """Append-only canonical encoder."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, value: int) -> "Writer":
        if not 0 <= value < 256:
            raise MalformedMessage(f"u8 out of range: {value}")
        self._parts.append(bytes((value,)))
        return self

    def u32(self, value: int) -> "Writer":
        if not 0 <= value < 2 ** 32:
            raise MalformedMessage(f"u32 out of range: {value}")
        self._parts.append(_U32.pack(value))
        return self

    def u64(self, value: int) -> "Writer":
        if not 0 <= value < 2 ** 64:
            raise MalformedMessage(f"u64 out of range: {value}")
        self._parts.append(_U64.pack(value))
        return self

    def blob(self, data: bytes) -> "Writer":
        if type(data) is not bytes:
            data = bytes(data)
        if len(data) >= 2 ** 32:
            raise MalformedMessage("field too long")
        self._parts.append(_U32.pack(len(data)))
        self._parts.append(data)
        return self

    def text(self, value: str) -> "Writer":
        return self.blob(value.encode("utf-8"))

    def fixed(self, data: bytes, n: int) -> "Writer":
        if type(data) is not bytes:
            data = bytes(data)
        if len(data) != n:
            raise MalformedMessage(f"expected exactly {n} bytes, got {len(data)}")
        self._parts.append(data)
        return self

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Strict decoder: every read checks bounds; ``done()`` refuses trailing bytes."""

    def __init__(self, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MalformedMessage("a message must be bytes")
        self._data = bytes(data)
        self._pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise MalformedMessage("message truncated")
        out = self._data[self._pos:self._pos + n]
        self._pos += n
        return out

    def u8(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self._take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self._take(8))[0]

    def blob(self, max_len: int) -> bytes:
        n = self.u32()
        if n > max_len:
            raise MalformedMessage(f"field of {n} bytes exceeds the limit of {max_len}")
        return self._take(n)

    def text(self, max_len: int = MAX_ID_BYTES) -> str:
        raw = self.blob(max_len)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedMessage("invalid UTF-8 in a text field") from None

    def fixed(self, n: int) -> bytes:
        return self._take(n)

    def remaining(self) -> int:
        return len(self._data) - self._pos

    def done(self) -> None:
        if self._pos != len(self._data):
            raise MalformedMessage(f"{len(self._data) - self._pos} trailing bytes")
