"""Canonical byte encoding of dpfed.v1 messages, the bytes that are signed and hashed.

Protobuf's binary serialisation is not guaranteed to be stable across versions or languages,
so signatures never cover it. The canonical form is UTF-8 JSON of the message's proto3 JSON
mapping (field names as in the .proto, defaults omitted), with sorted keys and no whitespace.
Doubles are written by Python's shortest round-trip repr, so decoding is exact.
"""

from __future__ import annotations

import functools
import hashlib
import json

from google.protobuf import json_format
from google.protobuf.message import Message

from dpfed.v1 import dpfed_pb2 as pb

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024

PAYLOAD_TYPES = {
    "dpfed.v1.RoundSpec": pb.RoundSpec,
    "dpfed.v1.Contribution": pb.Contribution,
    "dpfed.v1.Refusal": pb.Refusal,
    "dpfed.v1.SiteHello": pb.SiteHello,
    "dpfed.v1.PhaseMessage": pb.PhaseMessage,
    "dpfed.v1.PhaseNotice": pb.PhaseNotice,
}


class CanonicalError(ValueError):
    """The payload is not a canonical encoding of the expected message."""


def payload_type(message: Message) -> str:
    return message.DESCRIPTOR.full_name


def canonical_bytes(message: Message) -> bytes:
    obj = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def parse_canonical(data: bytes, type_name: str) -> Message:
    """Parse canonical bytes into a message of ``type_name``; reject non-canonical input, so
    one message has exactly one signed form."""
    cls = PAYLOAD_TYPES.get(type_name)
    if cls is None:
        raise CanonicalError(f"unknown payload type {type_name!r}")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise CanonicalError(f"payload of {len(data)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    message = _flat_message(data, cls)
    if message is not None:
        return message
    try:
        message = json_format.Parse(data.decode("utf-8"), cls())
    except (UnicodeDecodeError, json_format.ParseError, ValueError) as exc:
        raise CanonicalError(f"malformed {type_name} payload: {exc}") from None
    if canonical_bytes(message) != data:
        raise CanonicalError(f"{type_name} payload is not in canonical form")
    return message


# Singular proto3 fields without presence whose JSON mapping is a string the same as the
# value (string) or the decimal digits of an integer (64-bit integers are JSON strings).
_STRING = 9
_INT64_RANGES = {3: (-2**63, 2**63), 4: (0, 2**64), 6: (0, 2**64), 16: (-2**63, 2**63),
                 18: (-2**63, 2**63)}   # int64, uint64, fixed64, sfixed64, sint64


@functools.lru_cache(maxsize=None)
def _flat_fields(cls) -> dict[str, int]:
    """The fields of ``cls`` that ``_flat_message`` decodes (name -> protobuf type)."""
    return {f.name: f.type for f in cls.DESCRIPTOR.fields
            if (f.type == _STRING or f.type in _INT64_RANGES) and not f.has_presence
            and not getattr(f, "is_repeated", False) and f.containing_oneof is None}


def _flat_message(data: bytes, cls) -> Message | None:
    """``data`` decoded without protobuf's json_format if it sets only string and 64-bit
    integer fields (a consent, a hello: json_format costs about 0.1 ms of a 0.2 ms
    PhaseMessage check on the aggregator's event loop); else None and the caller uses the
    reference parser. Accepts only when re-encoding the decoded fields as ``canonical_bytes``
    does (defaults omitted, 64-bit integers as decimal strings, sorted keys, no whitespace)
    reproduces ``data`` byte for byte, so the accepted language and the message are those of
    the reference (tests/test_wire.py compares the two on canonical and non-canonical
    input)."""
    fields = _flat_fields(cls)
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict) or not obj.keys() <= fields.keys():
            return None
        values = {}
        for name, value in obj.items():
            if not isinstance(value, str):
                return None
            kind = fields[name]
            if kind != _STRING:
                low, high = _INT64_RANGES[kind]
                number = int(value)
                if not low <= number < high:
                    return None
                values[name] = number
            else:
                values[name] = value
        again = {name: str(v) if fields[name] != _STRING else v
                 for name, v in values.items() if v not in ("", 0)}
        if json.dumps(again, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8") != data:
            return None
        return cls(**values)
    except (ValueError, TypeError, RecursionError):   # UnicodeError is a ValueError
        return None


def digest(data: bytes) -> str:
    """Hex SHA-256 of canonical bytes (e.g. the spec digest a contribution answers)."""
    return hashlib.sha256(data).hexdigest()
