"""An in-memory driver of one round: every message goes through ``to_bytes``/``parse``.

Executable documentation of the call order for whoever wires ``dpfed.secagg.protocol`` into a
transport, and the harness of the tests and of benchmarks/bench_secagg.py. ``drop_before[site] =
phase`` makes ``site`` stop before sending its message of ``phase`` (Phase.MASKED_INPUT: it
drops out after key sharing, before releasing anything). Times are summed per phase over all
sites (sequential CPU time; real sites run in parallel) and for the aggregator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from dpfed.secagg.keys import identity_private_key
from dpfed.secagg.messages import Phase, parse
from dpfed.secagg.protocol import AggregateResult, AggregatorSession, RoundConfig, SiteSession

__all__ = ["SimulatedRound", "run_round"]

PHASES = (Phase.ADVERTISE, Phase.SHARE_KEYS, Phase.MASKED_INPUT, Phase.CONSISTENCY,
          Phase.UNMASK)


@dataclass
class SimulatedRound:
    result: AggregateResult
    aggregator: AggregatorSession
    sites: dict[str, SiteSession]
    site_seconds: dict[str, float] = field(default_factory=dict)
    site_seconds_max: dict[str, float] = field(default_factory=dict)
    aggregator_seconds: dict[str, float] = field(default_factory=dict)
    bytes_to_aggregator: dict[str, int] = field(default_factory=dict)
    #: Every message the aggregator received, as bytes: {phase name: {site: bytes}}.
    seen: dict[str, dict[str, bytes]] = field(default_factory=dict)


def run_round(config: RoundConfig, inputs: Mapping[str, np.ndarray], identities: Mapping,
              *, drop_before: Mapping[str, Phase] | None = None,
              aggregator_identity=None) -> SimulatedRound:
    drop_before = dict(drop_before or {})
    public = {s: identity_private_key(k).public_key() for s, k in identities.items()}
    agg_public = None if aggregator_identity is None else \
        identity_private_key(aggregator_identity).public_key()
    sites = {s: SiteSession(config, s, identities[s], public, aggregator_key=agg_public)
             for s in config.site_ids}
    agg = AggregatorSession(config, public, signing_key=aggregator_identity)
    out = SimulatedRound(None, agg, sites)

    def alive(s, phase):
        return s in sites and (s not in drop_before or drop_before[s] > phase)

    def step(phase, make, close):
        site_t, site_max, agg_t, nbytes = 0.0, 0.0, 0.0, 0
        replies = {}
        for s in config.site_ids:
            if not alive(s, phase):
                continue
            t0 = time.perf_counter()
            msg = make(s)
            if msg is None:
                continue
            data = msg.to_bytes()
            dt = time.perf_counter() - t0
            site_t += dt
            site_max = max(site_max, dt)
            replies[s] = data
            nbytes += len(data)
        t0 = time.perf_counter()
        for data in replies.values():
            agg.receive(parse(data))
        closing = close()
        agg_t += time.perf_counter() - t0
        out.site_seconds[phase.name] = site_t
        out.site_seconds_max[phase.name] = site_max
        out.aggregator_seconds[phase.name] = agg_t
        out.bytes_to_aggregator[phase.name] = nbytes
        out.seen[phase.name] = replies
        if isinstance(closing, dict):
            return {s: m.to_bytes() for s, m in closing.items()}
        return closing

    bundles = step(Phase.ADVERTISE, lambda s: sites[s].advertise(), agg.close_advertisements)
    deliveries = step(Phase.SHARE_KEYS, lambda s: sites[s].share_keys(bundles[s])
                      if s in bundles else None, agg.close_share_keys)
    lists = step(Phase.MASKED_INPUT, lambda s: sites[s].masked_input(deliveries[s], inputs[s])
                 if s in deliveries else None, agg.close_masked_inputs)
    requests = step(Phase.CONSISTENCY, lambda s: sites[s].confirm(lists[s])
                    if s in lists else None, agg.close_consistency)
    out.result = step(Phase.UNMASK, lambda s: sites[s].unmask(requests[s])
                      if s in requests else None, agg.finish)
    return out
