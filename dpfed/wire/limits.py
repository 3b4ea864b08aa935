"""Hard limits on everything that crosses the wire, in one place for both ends.

The aggregator checks every request against these before it touches a round (the cheap size
checks even before a signature is verified); the site checks a round spec against the same
numbers before it reads its data, and keeps what it sends (refusal reasons, labels) inside them,
so an honest site is never rejected for an over-long field. A request outside a limit is
rejected with INVALID_ARGUMENT and changes nothing (tests/test_limits.py,
tests/test_fuzz_grpc.py).

Why these numbers: d <= 512 keeps one release under 1.1 MB (d(d+1)/2 + d + 1 doubles) and one
ADVI fit tractable; identifiers are short ASCII so they are safe in file names, log lines and
SQL; feature names come from data dictionaries (GDSC names have spaces, parentheses and
commas), so they only exclude control characters; 10 000 sites is twice the largest load test
(benchmarks/bench_load.py).
"""

from __future__ import annotations

import math
import re

from dpfed.v1 import dpfed_pb2 as pb

MAX_FEATURES = 512
MAX_SITES = 10_000
MAX_ID_CHARS = 128              # round_id, site_id, coordinator_id
MAX_NAME_CHARS = 256            # target and feature names
MAX_REASON_CHARS = 1024         # Refusal.reason, RoundStatus messages
MAX_TEXT_CHARS = 1024           # public_source, software_version
MAX_FIT_DRAWS = 100_000
MAX_N = 10**9                   # records at one site; more is a bug or an attack
MAX_EPSILON = 100.0             # per round; real policies are far below
MAX_DEADLINE_MS = 7 * 24 * 3600 * 1000   # a round may stay open a week at most
MAX_SIGNATURE_BYTES = 64        # Ed25519
MAX_KEY_ID_CHARS = 32           # dpfed.wire.signing.key_id: 16 bytes hex
MAX_PAYLOAD_TYPE_CHARS = 64
# Largest legitimate payload: a d = 512 RoundSpec with public statistics (1.05 MB, 1.4 MB as
# base64) and 512 means and names. The transport's 16 MiB cap stays the outer bound.
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*")
NONCE_PATTERN = re.compile(r"[0-9a-f]{32}")       # 128 bits, lowercase hex (secrets.token_hex(16))
DIGEST_PATTERN = re.compile(r"[0-9a-f]{64}")      # SHA-256 hex
KEY_ID_PATTERN = re.compile(r"[0-9a-f]{32}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class LimitError(ValueError):
    """A message field is outside the wire limits; ``str(exc)`` says which and why."""


# ---- field checks: each returns a problem sentence or None --------------------------------
def _id(value: str, what: str) -> str | None:
    if not value:
        return f"{what} is empty"
    if len(value) > MAX_ID_CHARS:
        return f"{what} has {len(value)} characters (at most {MAX_ID_CHARS})"
    if not ID_PATTERN.fullmatch(value):
        return (f"{what} may only contain letters, digits and . _ : @ - and must start with a "
                f"letter or digit")
    return None


def _text(value: str, what: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"{what} has {len(value)} characters (at most {limit})"
    if _CONTROL.search(value):
        return f"{what} contains control characters"
    return None


def _pattern(value: str, what: str, pattern: re.Pattern, describe: str) -> str | None:
    if not pattern.fullmatch(value):
        return f"{what} must be {describe}"
    return None


def _finite(value: float, what: str) -> str | None:
    return None if math.isfinite(value) else f"{what} must be finite, got {value}"


def _raise(problems: list[str | None], what: str) -> None:
    found = [p for p in problems if p]
    if found:
        raise LimitError(f"{what}: " + "; ".join(found))


# ---- messages ------------------------------------------------------------------------------
def envelope_problems(envelope: pb.SignedEnvelope) -> list[str]:
    """Size checks on a SignedEnvelope, cheap enough to run before the signature."""
    problems = []
    if len(envelope.payload) > MAX_PAYLOAD_BYTES:
        problems.append(f"payload of {len(envelope.payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    if len(envelope.signature) > MAX_SIGNATURE_BYTES:
        problems.append(f"signature of {len(envelope.signature)} bytes (Ed25519 has 64)")
    if len(envelope.key_id) > MAX_KEY_ID_CHARS:
        problems.append(f"key_id has {len(envelope.key_id)} characters (at most "
                        f"{MAX_KEY_ID_CHARS})")
    if len(envelope.payload_type) > MAX_PAYLOAD_TYPE_CHARS:
        problems.append(f"payload_type has {len(envelope.payload_type)} characters")
    return problems


def check_envelope(envelope: pb.SignedEnvelope) -> None:
    _raise(envelope_problems(envelope), "envelope")


def spec_problems(spec: pb.RoundSpec) -> list[str]:
    """Everything in a RoundSpec outside the wire limits (semantic checks are elsewhere:
    aggregator.aggregate.validate_spec, site_node.policy.check_spec)."""
    d = len(spec.feature_names)
    problems = [_id(spec.round_id, "round_id"), _id(spec.coordinator_id, "coordinator_id")]
    if d > MAX_FEATURES:
        problems.append(f"{d} features (at most {MAX_FEATURES})")
    else:
        problems.append(_text(spec.target, "target", MAX_NAME_CHARS))
        bad = [i for i, f in enumerate(spec.feature_names)
               if not f or _text(f, "feature", MAX_NAME_CHARS)]
        if bad:
            problems.append(f"feature name {bad[0] + 1} is empty, longer than {MAX_NAME_CHARS} "
                            f"characters or contains control characters")
    if len(spec.sites) > MAX_SITES:
        problems.append(f"{len(spec.sites)} invited sites (at most {MAX_SITES})")
    else:
        problems.append(next((_id(s, f"invited site {i + 1}") for i, s in enumerate(spec.sites)
                              if _id(s, "")), None))
    if spec.quorum > MAX_SITES:
        problems.append(f"quorum {spec.quorum} exceeds {MAX_SITES}")
    if spec.fit_draws > MAX_FIT_DRAWS:
        problems.append(f"fit_draws {spec.fit_draws} exceeds {MAX_FIT_DRAWS}")
    if not (spec.epsilon <= MAX_EPSILON):  # also catches NaN
        problems.append(f"epsilon {spec.epsilon} exceeds {MAX_EPSILON}")
    problems += [_finite(spec.x_bound, "x_bound"), _finite(spec.y_bound, "y_bound")]
    if len(spec.budget_split) > 4:  # 4 under add/remove, 3 under replace-one
        problems.append(f"budget_split has {len(spec.budget_split)} shares")
    problems += [_text(spec.neighbouring, "neighbouring", MAX_NAME_CHARS),
                 _text(spec.xtx_sensitivity, "xtx_sensitivity", MAX_NAME_CHARS)]
    pre = spec.preprocessing
    if len(pre.x_mean) > MAX_FEATURES:
        problems.append(f"preprocessing has {len(pre.x_mean)} means (at most {MAX_FEATURES})")
    elif not all(math.isfinite(v) for v in pre.x_mean) or not math.isfinite(pre.y_mean):
        problems.append("preprocessing means must be finite")
    if len(pre.x_scale) > MAX_FEATURES:
        problems.append(f"preprocessing has {len(pre.x_scale)} scales (at most {MAX_FEATURES})")
    elif not all(math.isfinite(v) and v > 0 for v in pre.x_scale):
        problems.append("preprocessing column scales must be finite and > 0")
    problems.append(_text(spec.public_source, "public_source", MAX_TEXT_CHARS))
    # Imported here: dpfed.statistics loads NumPy, which the processes that only read the
    # wire's limits (the aggregator's audit writer) do without.
    from dpfed.statistics import encoded_length
    # A joint round's public statistics are a PublicTargets value: its 10-byte header
    # (dpfed.joint_statistics._PUBLIC_HEADER, "<4sHI") and one Statistics per target.
    m = len(spec.targets)
    expected = 10 + m * encoded_length(d) if m else encoded_length(d)
    if spec.public_statistics and len(spec.public_statistics) != expected:
        problems.append(f"public_statistics have {len(spec.public_statistics)} bytes, "
                        f"{expected} expected for {d} features"
                        + (f" and {m} targets" if m else ""))
    if spec.created_unix_ms and spec.deadline_unix_ms - spec.created_unix_ms > MAX_DEADLINE_MS:
        problems.append("deadline is more than a week after creation")
    if spec.consent_deadline_unix_ms and spec.consent_deadline_unix_ms >= spec.deadline_unix_ms:
        problems.append("consent_deadline_unix_ms must be before deadline_unix_ms")
    return [p for p in problems if p]


def check_spec(spec: pb.RoundSpec) -> None:
    _raise(spec_problems(spec), "round spec")


MAX_NOISE_TERMS = 8
# A masked input of d = MAX_FEATURES: 8 bytes per entry plus the secagg framing (round id,
# digest, sender, signature: well under 1 kB).
MAX_MASKED_BYTES = 8 * (MAX_FEATURES * (MAX_FEATURES + 1) // 2 + MAX_FEATURES + 2) + 4096


def check_contribution(c: pb.Contribution) -> None:
    """Field limits of a Contribution; the statistics length is checked against the round's
    dimension by aggregator.aggregate.encoded_n, here only against the largest possible."""
    problems = [_id(c.round_id, "round_id"), _id(c.site_id, "site_id"),
                _pattern(c.nonce, "nonce", NONCE_PATTERN, "32 lowercase hex digits"),
                _pattern(c.spec_digest, "spec_digest", DIGEST_PATTERN, "64 lowercase hex digits"),
                _finite(c.epsilon_spent, "epsilon_spent")]
    from dpfed.statistics import encoded_length     # NumPy: not at import (spec_problems)
    if len(c.statistics) > encoded_length(MAX_FEATURES):
        problems.append(f"statistics of {len(c.statistics)} bytes exceed the "
                        f"{encoded_length(MAX_FEATURES)} of {MAX_FEATURES} features")
    if c.masked:
        # Secure aggregation: the masked input (a dpfed.secagg MaskedInput of
        # d(d+1)/2 + d + 2 uint64 entries) replaces statistics and n.
        if len(c.masked) > MAX_MASKED_BYTES:
            problems.append(f"masked input of {len(c.masked)} bytes exceeds {MAX_MASKED_BYTES}")
        if c.statistics or c.n:
            problems.append("a masked contribution has empty statistics and n = 0")
    elif not 1 <= c.n <= MAX_N:
        problems.append(f"n = {c.n} is outside 1..{MAX_N}")
    # The noise description (dpfed.noise): a handful of terms per part; its meaning is checked
    # against the round by the aggregator (it must equal what the spec implies).
    for part in ("xtx", "xty", "yty", "n"):
        terms = getattr(c.noise, part)
        if len(terms) > MAX_NOISE_TERMS:
            problems.append(f"noise.{part} has {len(terms)} terms (at most {MAX_NOISE_TERMS})")
        elif any(_text(t.law, "noise law", MAX_NAME_CHARS) for t in terms):
            problems.append(f"noise.{part}: a law name is too long or has control characters")
    _raise(problems, "contribution")


def check_refusal(r: pb.Refusal) -> None:
    problems = [_id(r.round_id, "round_id"), _id(r.site_id, "site_id"),
                _pattern(r.nonce, "nonce", NONCE_PATTERN, "32 lowercase hex digits"),
                _pattern(r.spec_digest, "spec_digest", DIGEST_PATTERN, "64 lowercase hex digits"),
                _text(r.reason, "reason", MAX_REASON_CHARS), _finite(r.epsilon_spent, "epsilon_spent")]
    if math.isfinite(r.epsilon_spent) and not 0 <= r.epsilon_spent <= MAX_EPSILON:
        problems.append(f"epsilon_spent {r.epsilon_spent} is outside 0..{MAX_EPSILON}")
    _raise(problems, "refusal")


# Phases a site sends a PhaseMessage in, and the largest body (secure-aggregation key
# shares for a few hundred neighbours fit easily): consent, then for secure rounds the key
# advertisement, the key shares, the signature on the survivor set and the unmasking answer
# (docs/protocol.md).
SITE_PHASES = ("consent", "advertise", "share_keys", "confirm", "unmask")
MAX_PHASE_BODY_BYTES = 1024 * 1024


def check_phase_message(m: pb.PhaseMessage) -> None:
    problems = [_id(m.round_id, "round_id"), _id(m.site_id, "site_id"),
                _pattern(m.nonce, "nonce", NONCE_PATTERN, "32 lowercase hex digits"),
                _pattern(m.spec_digest, "spec_digest", DIGEST_PATTERN, "64 lowercase hex digits")]
    if m.phase not in SITE_PHASES:
        problems.append(f"phase must be one of {', '.join(SITE_PHASES)}")
    if len(m.body) > MAX_PHASE_BODY_BYTES:
        problems.append(f"body has {len(m.body)} bytes (at most {MAX_PHASE_BODY_BYTES})")
    _raise(problems, "phase message")


MAX_TRUSTED_COORDINATORS = 64   # SiteHello.trusted_coordinator_key_ids
MAX_TOTAL_EPSILON = 1e6         # SiteHello.total_epsilon (a lifetime budget)


def check_hello(h: pb.SiteHello) -> None:
    problems = [_id(h.site_id, "site_id"),
                _pattern(h.nonce, "nonce", NONCE_PATTERN, "32 lowercase hex digits"),
                _text(h.software_version, "software_version", MAX_TEXT_CHARS),
                _finite(h.total_epsilon, "total_epsilon")]
    if math.isfinite(h.total_epsilon) and not 0 <= h.total_epsilon <= MAX_TOTAL_EPSILON:
        problems.append(f"total_epsilon {h.total_epsilon} is outside 0..{MAX_TOTAL_EPSILON:g}")
    ids = list(h.trusted_coordinator_key_ids)
    if len(ids) > MAX_TRUSTED_COORDINATORS:
        problems.append(f"{len(ids)} trusted coordinator key ids (at most "
                        f"{MAX_TRUSTED_COORDINATORS})")
    else:
        problems += [_pattern(k, "trusted_coordinator_key_ids", KEY_ID_PATTERN,
                              "32 lowercase hex digits") for k in ids]
    _raise(problems, "site hello")


def check_round_query(round_id: str) -> None:
    _raise([_id(round_id, "round_id")], "query")


def check_site_query(site_id: str) -> None:
    _raise([_id(site_id, "site_id")], "query")


def clip_text(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` made safe to send in a limited field: control characters become spaces and it
    is cut to ``limit`` characters (with an ellipsis)."""
    text = _CONTROL.sub(" ", text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def clip_id(value: str) -> str:
    """A label that passes the id check, or "" (only for labelling refusals of specs that did
    not verify; an empty round_id is then rejected by the aggregator, which is right)."""
    return value if _id(value, "id") is None else ""


# The check for each signed message a site sends, by payload type.
SITE_MESSAGE_CHECKS = {
    "dpfed.v1.Contribution": check_contribution,
    "dpfed.v1.Refusal": check_refusal,
    "dpfed.v1.SiteHello": check_hello,
    "dpfed.v1.PhaseMessage": check_phase_message,
}
