"""What the aggregator answers about its rounds and sites without changing them: a round's
status and result, the sites, their spending, the list of rounds, what a site is pushed, and
the sum a round is fitted on. Who may see what is aggregator.budget.SiteBudgets.hidden's:
the n, epsilon and refusal reason of a site that does not trust the reading coordinator are
hidden."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dpfed import secure_round
from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from dpfed.wire.canonical import canonical_bytes

from aggregator import aggregate, identity
from aggregator.contribution_wire import check_fields, parse_envelope
from aggregator.errors import Rejected
from aggregator.rounds import secure_session
from aggregator.rounds.context import RoundContext
from aggregator.rounds.contributions import (AcceptedContribution, noise_of,
                                             stored_contribution, sum_noise, with_public)
from aggregator.rounds.recovery import load_contributions
from aggregator.rounds.states import CONSENT, RELEASE, STATE_TO_PB

def summary_target(spec: pb.RoundSpec) -> str:
    """RoundSummary.target: the response column, or for a joint round (whose spec.target is
    empty) the text "[m targets]" (docs/protocol.md, "Joint rounds")."""
    if spec.targets:
        return f"[{len(spec.targets)} targets]"
    return spec.target


# ListRounds: rows per page by default and at most.
DEFAULT_LIST_ROUNDS, MAX_LIST_ROUNDS = 100, 1000


@dataclass(eq=False)
class RoundReads:
    ctx: RoundContext

    def _reader(self, peer: identity.PeerIdentity | None) -> tuple[str | None, str | None]:
        """(reader, its key id) for the visibility rules (aggregator.budget.SiteBudgets.hidden):
        (None, None) without TLS; a peer that is not a coordinator reads as trusted by no-one."""
        if peer is None:
            return None, None
        if peer.kind != identity.COORDINATOR:
            return str(peer), None
        return peer.party_id, self.ctx.registry.key_of_coordinator(peer.party_id)

    def status(self, round_id: str, peer: identity.PeerIdentity | None = None) -> pb.RoundStatus:
        """The round's status as ``peer`` may see it: the n, epsilon and refusal reason of a
        site that does not trust the reading coordinator are hidden (aggregator.budget)."""
        ctx = self.ctx
        check_fields(limits.check_round_query, round_id)
        reader, reader_kid = self._reader(peer)
        with ctx.lock:
            live = ctx.rounds.get(round_id)
            if live is None:
                raise Rejected("NOT_FOUND", f"unknown round {round_id!r}")
            s = live.stored
            contributions = sorted(live.contributions.items())
            if live.archived is not None:   # a finished round loaded from the store
                contributions = [(site, AcceptedContribution(b"", b"", b"", n, eps, ms))
                                 for site, n, eps, ms in ctx.store.contribution_rows(round_id)]
            refusals = sorted(live.refusals.items())
            spec = pb.RoundSpec()
            spec.CopyFrom(live.spec)
            spec.ClearField("public_statistics")
            status = pb.RoundStatus(
                round_id=round_id, state=STATE_TO_PB[s.state], quorum=s.quorum,
                deadline_unix_ms=s.deadline_ms, message=s.message, spec_digest=s.spec_digest,
                round_seconds=s.round_s, fit_seconds=s.fit_s, missing_sites=live.missing(),
                consented=sorted(live.consents),
                dropped=live.dropped([site for site, _ in contributions]),
                started_unix_ms=s.started_ms,
                phases=[pb.PhaseTime(phase=p, started_unix_ms=t, seconds=sec)
                        for p, t, sec in s.phases],
                spec=spec, invited=sorted(live.invited))
            refusal_eps = dict(live.refusal_epsilons)
        starter = live.spec.coordinator_id
        for k, c in contributions:
            hidden = ctx.budgets.hidden(k, reader, reader_kid, starter)
            status.contributions.append(
                pb.SiteContribution(site_id=k, hidden=hidden) if hidden else
                pb.SiteContribution(site_id=k, n=c.n, epsilon_spent=c.epsilon,
                                    received_unix_ms=c.received_ms))
        for k, r in refusals:
            hidden = ctx.budgets.hidden(k, reader, reader_kid, starter)
            status.refusals.append(
                pb.SiteRefusalInfo(site_id=k, hidden=hidden) if hidden else
                pb.SiteRefusalInfo(site_id=k, reason=r, epsilon_spent=refusal_eps.get(k, 0.0)))
        return status

    def result(self, round_id: str, peer: identity.PeerIdentity | None = None) -> pb.RoundResult:
        """The round's result as ``peer`` may see it. The posterior is shown to the round's
        own coordinator (every contributing site trusted it: it answered its signed spec) and
        to any coordinator every contributing site trusts; another coordinator gets
        PERMISSION_DENIED. Per-site rows of a site that (no longer) trusts the reader are
        hidden, and then n_total too (it would give the hidden n by subtraction)."""
        ctx = self.ctx
        status = self.status(round_id)
        if status.state != pb.RoundStatus.DONE:
            state = pb.RoundStatus.State.Name(status.state)
            why = f": {status.message}" if status.message else ""
            raise Rejected("FAILED_PRECONDITION", f"round {round_id!r} has no result: it is "
                                                  f"{state}{why}")
        res = ctx.store.get_result(round_id)
        summary_json = res.summary_json
        reader, reader_kid = self._reader(peer)
        if reader is not None:
            starter = ctx.rounds[round_id].spec.coordinator_id
            hidden = {c.site_id: ctx.budgets.hidden(c.site_id, reader, reader_kid, starter)
                      for c in status.contributions}
            hidden = {k: v for k, v in hidden.items() if v}
            if hidden and reader != starter:
                raise Rejected("PERMISSION_DENIED",
                               f"the result of round {round_id!r} is post-processing of the "
                               f"releases of site(s) {', '.join(sorted(hidden))}, which do not "
                               f"trust coordinator {reader!r}")
            if hidden:
                summary = json.loads(summary_json)
                summary["sites"] = [{"site_id": r["site_id"], "hidden": hidden[r["site_id"]]}
                                    if r.get("site_id") in hidden else r
                                    for r in summary.get("sites", [])]
                summary["n_total"] = None
                summary_json = json.dumps(summary, sort_keys=True)
        return pb.RoundResult(round_id=round_id, summary_json=summary_json,
                              beta_draws=res.beta_draws, draws=res.draws, dim=res.dim,
                              targets=len(ctx.rounds[round_id].spec.targets))

    def list_sites(self, peer: identity.PeerIdentity | None = None) -> pb.ListSitesReply:
        """Every registered site; its details (key, connection, spend, declared total) only
        to a coordinator it trusts: others get the site id (membership) and why."""
        budgets = self.ctx.budgets
        reader, reader_kid = self._reader(peer)
        reply = pb.ListSitesReply()
        for r in self.ctx.registry.snapshot():
            hidden = budgets.hidden(r.site_id, reader, reader_kid)
            if hidden:
                reply.sites.append(pb.SiteInfo(site_id=r.site_id, hidden=hidden))
                continue
            b = budgets.view(r.site_id)
            reply.sites.append(pb.SiteInfo(
                site_id=r.site_id, key_id=r.key_id, connected=r.connected_streams > 0,
                last_seen_unix_ms=r.last_seen_unix_ms, spent_epsilon=b.spent,
                declared_total_epsilon=b.declared_total, rounds=b.rounds))
        return reply

    def site_spending(self, site_id: str,
                      peer: identity.PeerIdentity | None = None) -> pb.SiteSpending:
        """``site_id``'s spending round by round as recorded here (GetSiteSpending); only
        to a coordinator the site trusts (the rules of ``list_sites``)."""
        check_fields(limits.check_site_query, site_id)
        if site_id not in self.ctx.registry.sites:
            raise Rejected("NOT_FOUND", f"unknown site {site_id!r}")
        reader, reader_kid = self._reader(peer)
        hidden = self.ctx.budgets.hidden(site_id, reader, reader_kid)
        if hidden:
            return pb.SiteSpending(site_id=site_id, hidden=hidden)
        return self.ctx.budgets.spending(site_id)

    def list_rounds(self, limit: int = 0, before: str = "") -> pb.ListRoundsReply:
        """One summary line per round, newest first (counts only, no per-site rows: which
        sites answered is in GetRound, under its visibility rules). ``before``: a round id;
        only rounds started before it (paging)."""
        ctx = self.ctx
        limit = min(limit or DEFAULT_LIST_ROUNDS, MAX_LIST_ROUNDS)
        if before:
            check_fields(limits.check_round_query, before)
        with ctx.lock:
            lives = sorted(ctx.rounds.values(),
                           key=lambda r: (r.stored.started_ms, r.stored.round_id), reverse=True)
            if before:
                anchor = ctx.rounds.get(before)
                if anchor is None:
                    raise Rejected("NOT_FOUND", f"unknown round {before!r}")
                key = (anchor.stored.started_ms, anchor.stored.round_id)
                lives = [r for r in lives if (r.stored.started_ms, r.stored.round_id) < key]
            reply = pb.ListRoundsReply()
            for live in lives[:limit]:
                s, spec = live.stored, live.spec
                reply.rounds.append(pb.RoundSummary(
                    round_id=s.round_id, state=STATE_TO_PB[s.state],
                    coordinator_id=spec.coordinator_id, target=summary_target(spec),
                    epsilon=spec.epsilon, invited=len(live.invited),
                    consented=len(live.consents),
                    contributed=(len(live.contributions) if live.archived is None
                                 else live.archived),
                    refused=len(live.refusals), quorum=s.quorum, started_unix_ms=s.started_ms,
                    deadline_unix_ms=s.deadline_ms, message=s.message))
        return reply

    def message_for_site(self, round_id: str, site_id: str) -> pb.SignedEnvelope | None:
        """What to push to ``site_id`` about ``round_id``, if the current phase waits for it:
        in CONSENT the coordinator-signed spec (the site answers with a consent or a
        refusal), in RELEASE a PhaseNotice naming the participants and carrying that spec (the
        site releases), in a secure step that step's notice (aggregator.rounds.secure_session).
        None when the round needs nothing (more) from the site."""
        with self.ctx.lock:
            live = self.ctx.rounds.get(round_id)
            if live is None or site_id in live.refusals:
                return None
            if live.secure is not None and live.step:
                return secure_session.notice(self.ctx, live, site_id)
            if live.state == CONSENT:
                if site_id in live.invited and site_id not in live.consents:
                    return live.envelope
                return None
            if (live.state == RELEASE and site_id in live.participants
                    and site_id not in live.contributions and site_id not in live.storing):
                notice = pb.PhaseNotice(round_id=round_id, phase="release",
                                        spec_envelope=live.stored.spec_envelope,
                                        participants=sorted(live.participants),
                                        deadline_unix_ms=live.stored.deadline_ms)
                return pb.SignedEnvelope(payload=canonical_bytes(notice),
                                         payload_type="dpfed.v1.PhaseNotice")
            return None

    def pending_rounds(self, site_id: str) -> list[str]:
        with self.ctx.lock:
            return [rid for rid in self.ctx.rounds
                    if self.message_for_site(rid, site_id) is not None]

    def aggregated_statistics(self, round_id: str) -> Statistics:
        """The sum the model is fitted on (for tests and audits): the running total of the
        accepted releases plus the public statistics. A joint round: the JointStatistics sum
        of the releases (its public statistics are per target, added to each target's view
        at the fit)."""
        ctx = self.ctx
        with ctx.lock:
            live = ctx.round(round_id)
            if secure_round.is_secure(live.spec):
                if not live.contributions:
                    load_contributions(ctx.store, live)
                running = secure_session.unmasked_total(ctx, live).copy()
                noise = sum_noise(c.noise for c in live.contributions.values())
                return with_public(running, live.spec, noise)
            if live.running is None and live.spec.targets:   # a finished joint round
                running = aggregate.running_total(live.spec)
                stored = ctx.store.contributions(round_id)
                for c in stored:
                    running.add_encoded(c.statistics)
                return running.total(noise=sum_noise(
                    noise_of(stored_contribution(parse_envelope(c.envelope).payload))
                    for c in stored))
            if live.running is None:   # a finished round loaded from the store
                stored = ctx.store.contributions(round_id)
                parts = [c.statistics for c in stored]
                if not parts and not live.spec.public_statistics:
                    return Statistics.zeros(live.stored.dim)
                noise = sum_noise(noise_of(stored_contribution(parse_envelope(c.envelope).payload))
                                  for c in stored)
                return aggregate.aggregate_encoded(parts, live.spec.public_statistics,
                                                   noise=noise)
            running = live.running.copy()
            noise = sum_noise(c.noise for c in live.contributions.values())
        return with_public(running, live.spec, noise)
