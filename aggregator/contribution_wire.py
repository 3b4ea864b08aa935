"""Cheap checks and a fast decoder for what arrives on the wire, before any round logic.

``fast_contribution`` decodes the hot path's canonical Contribution payload without
protobuf's json_format; the envelope size and field checks run before any signature work so
an oversized field never reaches the verifier, the store or a log line.
"""

from __future__ import annotations

import binascii
import functools
import json
import math

from google.protobuf import json_format

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from dpfed.wire.canonical import parse_canonical

from aggregator.errors import Rejected

_CONTRIBUTION_FIELDS = {"round_id": str, "site_id": str, "statistics": str, "n": str,
                        "epsilon_spent": (int, float), "spec_digest": str,
                        "timestamp_unix_ms": str, "nonce": str, "noise": dict}


_STATISTICS_KEY = b'"statistics":"'
# Stands in for the base64 statistics while the rest of the payload is parsed and re-encoded:
# any non-empty string would do (an empty one is omitted from canonical JSON).
_PLACEHOLDER = "A"


def fast_contribution(payload: bytes) -> pb.Contribution | None:
    """Decode a canonical Contribution payload without protobuf's json_format, which costs
    about 1 ms per 17 kB contribution (d = 64) on the hot path. Accepts only when
    re-encoding the decoded fields the way canonical_bytes does reproduces ``payload`` byte
    for byte; anything else returns None and the caller uses the reference parser, so the
    accepted language is unchanged (tests/test_aggregator_rounds.py checks both agree).

    The 23 kB base64 statistics string is cut out before JSON sees it (the JSON scanner and
    encoder would each walk it character by character) and decoded on its own: the rest, with
    a one-character placeholder in its place, must re-encode to itself. That is enough,
    because in canonical JSON a raw ``"`` only delimits strings (inside one it is escaped as
    ``\\"``), so the first ``"statistics":"`` of an encoding that round-trips is the key, and
    the cut value holds only base64 characters (checked by the decoder), which JSON never
    escapes."""
    try:
        cut = payload.find(_STATISTICS_KEY)
        if cut >= 0:
            cut += len(_STATISTICS_KEY)
            end = payload.find(b'"', cut)
            if end < 0:
                return None
            b64, rest = payload[cut:end], payload[:cut] + _PLACEHOLDER.encode() + payload[end:]
        else:
            b64, rest = b"", payload
        obj = json.loads(rest)
        if not isinstance(obj, dict) or not obj.keys() <= _CONTRIBUTION_FIELDS.keys():
            return None
        for k, v in obj.items():
            if not isinstance(v, _CONTRIBUTION_FIELDS[k]) or isinstance(v, bool):
                return None
        if (cut >= 0) != ("statistics" in obj) or obj.get("statistics", _PLACEHOLDER) != _PLACEHOLDER:
            return None
        stats = canonical_b64decode(b64)
        if stats is None:
            return None
        n = int(obj.get("n", "0"))
        ts = int(obj.get("timestamp_unix_ms", "0"))
        eps = float(obj.get("epsilon_spent", 0.0))
        if not (0 <= n < 2**64 and -2**63 <= ts < 2**63 and math.isfinite(eps)):
            return None
        msg = pb.Contribution(round_id=obj.get("round_id", ""), site_id=obj.get("site_id", ""),
                              statistics=stats, n=n, epsilon_spent=eps,
                              spec_digest=obj.get("spec_digest", ""), timestamp_unix_ms=ts,
                              nonce=obj.get("nonce", ""))
        noise = None
        if "noise" in obj:
            raw, noise = _noise_message(json.dumps(obj["noise"], sort_keys=True,
                                                   separators=(",", ":")))
            msg.noise.MergeFromString(raw)
            msg.noise.SetInParent()
        again = {k: v for k, v in (
            ("round_id", msg.round_id), ("site_id", msg.site_id),
            ("statistics", _PLACEHOLDER if stats else ""),
            ("n", str(n) if n else ""), ("epsilon_spent", eps if eps else None),
            ("spec_digest", msg.spec_digest), ("timestamp_unix_ms", str(ts) if ts else ""),
            ("nonce", msg.nonce), ("noise", noise)) if v not in ("", None)}
        canonical = json.dumps(again, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               allow_nan=False).encode("utf-8")
        return msg if canonical == rest else None
    except (ValueError, TypeError, UnicodeDecodeError, binascii.Error, json_format.ParseError):
        return None


@functools.lru_cache(maxsize=64)
def _noise_message(text: str) -> tuple[bytes, dict]:
    """A contribution's noise description, as JSON text, parsed by protobuf's own JSON
    mapping: its wire bytes and its dict again (for the re-encoding check). Cached, because
    every site of a round declares the same few terms and the mapping costs about 50 us a
    contribution; the dict is shared, so it is only read. Parse errors are not cached."""
    msg = pb.NoiseDescription()
    json_format.Parse(text, msg)
    return (msg.SerializeToString(deterministic=True),
            json_format.MessageToDict(msg, preserving_proto_field_name=True))


def check_envelope_size(envelope: pb.SignedEnvelope) -> None:
    """Wire limits (dpfed.wire.limits) before any signature work: cheap, and an oversized
    field never reaches the verifier, the store or a log line."""
    problems = limits.envelope_problems(envelope)
    if problems:
        raise Rejected("INVALID_ARGUMENT", "envelope: " + "; ".join(problems))


def check_fields(check, value) -> None:
    try:
        check(value)
    except limits.LimitError as exc:
        raise Rejected("INVALID_ARGUMENT", str(exc)) from None


def canonical_b64decode(text: bytes) -> bytes | None:
    """The bytes ``text`` encodes if it is the standard padded base64 that
    ``base64.b64encode`` produces, else None. Strict decoding rejects other alphabets, missing
    or excess padding and anything after it; what it still accepts is non-zero unused bits in
    the last quantum (b"QR==" decodes like b"QQ=="), so only that quantum is re-encoded: the
    full check without re-encoding the whole 17 kB (d = 64) on the hot path."""
    try:
        data = binascii.a2b_base64(text, strict_mode=True)
    except binascii.Error:
        return None
    if len(text) != 4 * -(-len(data) // 3):
        return None
    tail = len(data) % 3 or 3
    if data and binascii.b2a_base64(data[-tail:], newline=False) != text[-4:]:
        return None
    return data


def parse_envelope(data: bytes) -> pb.SignedEnvelope:
    env = pb.SignedEnvelope()
    env.ParseFromString(data)
    return env


def envelope_statistics(data: bytes) -> bytes:
    """The statistics a stored contribution envelope carries (empty for a masked release):
    the only copy the store keeps (aggregator.store). Raises (protobuf's DecodeError,
    dpfed.wire.canonical.CanonicalError) if ``data`` is not a contribution envelope."""
    payload = parse_envelope(data).payload
    return (fast_contribution(payload)
            or parse_canonical(payload, "dpfed.v1.Contribution")).statistics
