"""What every part of a round shares: the store, the registry, the lock, authentication, the
sites' streams, their budgets, the clock, the aggregator's signing key and the live rounds.

One RoundContext per aggregator (aggregator.rounds.manager.RoundManager builds it); the
phases (consent, release, secure steps, refusals, reads, recovery) and the transitions get it
and nothing else of each other's, so what a phase may touch is written in one place.
"""

from __future__ import annotations

import threading
import time

from aggregator.authentication import SiteAuthenticator
from aggregator.budget import SiteBudgets
from aggregator.errors import Rejected
from aggregator.registry import Registry
from aggregator.rounds.live import LiveRound
from aggregator.store import RoundStore
from aggregator.subscribers import Subscribers


class RoundContext:
    def __init__(self, store: RoundStore, registry: Registry, *, max_clock_skew_s: float = 300.0,
                 skip_fit: bool = False, clock=time.time, signing_key=None):
        self.store = store
        self.registry = registry
        # The aggregator's identity key (dpfed.wire.signing.SigningKey, aggregator.toml
        # signing_key): signs every secure-aggregation message it sends. None: secure rounds
        # are refused at StartRound (aggregator.rounds.secure_session.signing_problem).
        self.signing_key = signing_key
        self.max_clock_skew_ms = int(max_clock_skew_s * 1000)
        self.skip_fit = skip_fit
        self.clock = clock
        # Guards every LiveRound and the maps below; reentrant (a transition started under it
        # arms the next phase's timer).
        self.lock = threading.RLock()
        # round id -> LiveRound: every round this aggregator knows, finished ones too.
        self.rounds: dict[str, LiveRound] = {}
        # Signature, identity, freshness and replay checks (aggregator.authentication).
        self.auth = SiteAuthenticator(registry, store, max_clock_skew_ms=self.max_clock_skew_ms,
                                      now_ms=self.now_ms, lock=self.lock)
        # The sites' open round streams (aggregator.subscribers).
        self.subscribers = Subscribers(self.lock)
        # Each site's recorded spend, declared total and trusted coordinators (aggregator.budget).
        self.budgets = SiteBudgets(store)
        # Set by RoundManager.close: no timer, transition or fit runs after it.
        self.closed = False

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def round(self, round_id: str) -> LiveRound:
        """The live round ``round_id``; Rejected (FAILED_PRECONDITION) if there is none."""
        live = self.rounds.get(round_id)
        if live is None:
            raise Rejected("FAILED_PRECONDITION", f"unknown round {round_id!r}")
        return live

    def notify(self, sites, round_id: str) -> None:
        """Wake the round streams of ``sites``: each pushes what
        aggregator.rounds.reads.RoundReads.message_for_site says."""
        self.subscribers.notify(sites, round_id)
