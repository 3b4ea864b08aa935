"""Canonical byte encoding of dpfed.v1 messages, the bytes that are signed and hashed.

Protobuf's binary serialisation is not guaranteed to be stable across versions or languages,
so signatures never cover it. The canonical form is UTF-8 JSON of the message's proto3 JSON
mapping (field names as in the .proto, defaults omitted), with sorted keys and no whitespace.
Doubles are written by Python's shortest round-trip repr, so decoding is exact.
"""

from __future__ import annotations

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
    try:
        message = json_format.Parse(data.decode("utf-8"), cls())
    except (UnicodeDecodeError, json_format.ParseError, ValueError) as exc:
        raise CanonicalError(f"malformed {type_name} payload: {exc}") from None
    if canonical_bytes(message) != data:
        raise CanonicalError(f"{type_name} payload is not in canonical form")
    return message


def digest(data: bytes) -> str:
    """Hex SHA-256 of canonical bytes (e.g. the spec digest a contribution answers)."""
    return hashlib.sha256(data).hexdigest()
