"""Who sent a site's message, and whether it is fresh and new.

Every signed message a site sends (SiteHello, PhaseMessage, Contribution, Refusal) passes
here before any round state is read: the envelope's wire limits, the Ed25519 signature of a
registered site key (verified on the bytes before they are parsed; contributions take the
fast decoder, aggregator.contribution_wire), the message's own limits, the key <-> site <->
TLS certificate binding (aggregator.identity), the clock-skew window and the replay check on
the (key, nonce) pair. Nonces are durable (aggregator.store) for the clock-skew window, so a
restart does not reopen a replay.
"""

from __future__ import annotations

import threading

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from dpfed.wire.canonical import CanonicalError
from dpfed.wire.signing import SignatureError, verify, verify_signature

from aggregator import identity
from aggregator.contribution_wire import check_envelope_size, check_fields, fast_contribution
from aggregator.errors import Rejected
from aggregator.registry import Registry
from aggregator.store import RoundStore


class SiteAuthenticator:
    """Signature, identity, freshness and replay checks of site messages. ``lock`` is the
    round manager's lock, so that taking a nonce and changing a round are one step."""

    def __init__(self, registry: Registry, store: RoundStore, *, max_clock_skew_ms: int,
                 now_ms, lock: threading.RLock):
        self.registry = registry
        self.store = store
        self.max_clock_skew_ms = max_clock_skew_ms
        self.now_ms = now_ms
        self._lock = lock
        # (key id, nonce) of every message accepted within the clock-skew window.
        self.nonces: set[tuple[str, str]] = set()

    def load(self) -> None:
        """Forget nonces older than the window (their timestamps are refused anyway) and load
        the rest from the store (start-up)."""
        now = self.now_ms()
        self.store.prune_nonces(now - self.max_clock_skew_ms)
        self.nonces = set(self.store.nonces_since(now - self.max_clock_skew_ms))

    def check_fresh(self, timestamp_ms: int, what: str) -> None:
        skew = abs(self.now_ms() - timestamp_ms)
        if skew > self.max_clock_skew_ms:
            raise Rejected("UNAUTHENTICATED",
                           f"{what} timestamp is {skew / 1000:.0f} s away from the aggregator's "
                           f"clock (allowed {self.max_clock_skew_ms / 1000:.0f} s): stale or "
                           f"clock out of sync")

    def verify_site(self, envelope: pb.SignedEnvelope, type_name: str,
                    peer: identity.PeerIdentity | None = None):
        """The message of type ``type_name`` in ``envelope``, if a registered site signed it
        and the TLS peer (if any) is that site; else Rejected."""
        check_envelope_size(envelope)
        msg = None
        if type_name == "dpfed.v1.Contribution" and envelope.payload_type == type_name:
            public_key = self.registry.site_keys.get(envelope.key_id)
            if public_key is not None:
                # Same order as signing.verify: bytes verified first, parsed only after.
                try:
                    verify_signature(envelope, public_key, type_name)
                except SignatureError as exc:
                    raise Rejected("UNAUTHENTICATED", str(exc)) from None
                msg = fast_contribution(envelope.payload)
        try:
            if msg is None:
                msg = verify(envelope, self.registry.site_keys, type_name)
        except SignatureError as exc:
            raise Rejected("UNAUTHENTICATED", str(exc)) from None
        except CanonicalError as exc:
            raise Rejected("INVALID_ARGUMENT", str(exc)) from None
        check_fields(limits.SITE_MESSAGE_CHECKS[type_name], msg)
        owner = self.registry.site_of_key(envelope.key_id)
        if msg.site_id != owner:
            raise Rejected("PERMISSION_DENIED",
                           f"{type_name} claims site {msg.site_id!r} but is signed by the key "
                           f"of {owner!r}")
        # Key and TLS certificate must name the same site (aggregator.identity).
        mismatch = identity.site_mismatch(peer, msg.site_id)
        if mismatch:
            raise Rejected("PERMISSION_DENIED", f"{type_name}: {mismatch}")
        return msg

    def take_nonce(self, kid: str, nonce: str, timestamp_ms: int, what: str,
                   persist: bool = True) -> None:
        """Refuse a nonce seen before (a replay). With ``persist`` it is stored and remembered
        now; otherwise the caller stores it with the message it came with and then adds it to
        ``nonces``."""
        if not nonce:
            raise Rejected("INVALID_ARGUMENT", f"{what} has no nonce")
        with self._lock:
            if (kid, nonce) in self.nonces:
                raise Rejected("ALREADY_EXISTS", f"{what} nonce {nonce[:16]} was already used "
                                                 f"(replay)")
            if persist:
                self.store.insert_nonce(kid, nonce, timestamp_ms)
                self.nonces.add((kid, nonce))
