"""View models: the aggregator's replies turned into plain values a template shows.

Pure functions of protobuf messages and the result summary (dicts), no I/O, so each page's
content is tested without a server. Times are shown in UTC. A site that does not trust this
coordinator appears with its id and the reason its details are hidden, never with zeros
that would read as facts.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from dpfed.v1 import dpfed_pb2 as pb

FINAL_STATES = ("DONE", "FAILED")
# The phases of docs/protocol.md in the order a round goes through them.
PHASE_ORDER = ("CONSENT", "KEYS", "RELEASE", "UNMASK", "FITTING")


def state_name(state: int) -> str:
    return pb.RoundStatus.State.Name(state)


def utc(ms: int) -> str:
    """``2026-11-23 09:26:06 UTC``; "" for 0 (never)."""
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(ms: int, now_ms: int) -> str:
    """How long before ``now_ms``: "12 s ago", "5 min ago", "3 h ago", "2 d ago"; "never"."""
    if not ms:
        return "never"
    s = max(0.0, (now_ms - ms) / 1000)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 90 * 60:
        return f"{s / 60:.0f} min ago"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} d ago"


def seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min"


def eps(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


# ---- sites ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SiteRow:
    site_id: str
    hidden: str = ""
    connected: bool = False
    last_seen: str = ""
    last_seen_ago: str = "never"
    rounds: int = 0
    spent: float = 0.0
    declared: float | None = None      # None: the site never declared a total
    remaining: float | None = None
    used_percent: int | None = None    # of the declared total, 0..100 (for the bar)
    exhausted: bool = False            # nothing (or less than nothing) left
    key_id: str = ""


def site_row(s: pb.SiteInfo, now_ms: int) -> SiteRow:
    if s.hidden:
        return SiteRow(site_id=s.site_id, hidden=s.hidden)
    declared = s.declared_total_epsilon or None
    remaining = None if declared is None else declared - s.spent_epsilon
    used = None if declared is None else int(round(min(1.0, s.spent_epsilon / declared) * 100))
    return SiteRow(site_id=s.site_id, connected=s.connected, last_seen=utc(s.last_seen_unix_ms),
                   last_seen_ago=ago(s.last_seen_unix_ms, now_ms), rounds=s.rounds,
                   spent=s.spent_epsilon, declared=declared, remaining=remaining,
                   used_percent=used, exhausted=remaining is not None and remaining <= 1e-9,
                   key_id=s.key_id)


@dataclass(frozen=True)
class SitesPage:
    rows: list[SiteRow]
    connected: int
    total: int
    hidden: int
    exhausted: int
    spent: float


def sites_page(sites, now_ms: int) -> SitesPage:
    rows = [site_row(s, now_ms) for s in sites]
    return SitesPage(rows=rows, connected=sum(r.connected for r in rows), total=len(rows),
                     hidden=sum(bool(r.hidden) for r in rows),
                     exhausted=sum(r.exhausted for r in rows),
                     spent=sum(r.spent for r in rows))


@dataclass(frozen=True)
class SpendRow:
    round_id: str
    epsilon: float
    when: str
    refused: bool
    cumulative: float


@dataclass(frozen=True)
class SitePage:
    site: SiteRow
    spends: list[SpendRow]


def site_page(info: pb.SiteInfo, spending: pb.SiteSpending | None, now_ms: int) -> SitePage:
    """One site: its row of the sites table and, unless hidden, each round it spent in
    (newest first) with the running total."""
    row = site_row(info, now_ms)
    spends, total = [], 0.0
    if spending is not None and not spending.hidden:
        for r in spending.rounds:
            total += r.epsilon
            spends.append(SpendRow(r.round_id, r.epsilon, utc(r.received_unix_ms), r.refused,
                                   total))
    return SitePage(site=row, spends=spends[::-1])


# ---- rounds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRow:
    round_id: str
    state: str
    final: bool
    started: str
    target: str
    epsilon: float
    invited: int
    consented: int
    contributed: int
    refused: int
    quorum: int
    coordinator_id: str
    message: str


def round_row(r: pb.RoundSummary) -> RoundRow:
    state = state_name(r.state)
    return RoundRow(round_id=r.round_id, state=state, final=state in FINAL_STATES,
                    started=utc(r.started_unix_ms), target=r.target, epsilon=r.epsilon,
                    invited=r.invited, consented=r.consented, contributed=r.contributed,
                    refused=r.refused, quorum=r.quorum, coordinator_id=r.coordinator_id,
                    message=r.message)


@dataclass(frozen=True)
class RoundsPage:
    rows: list[RoundRow]
    next_before: str | None       # the round id to page on from, if there may be more
    before: str | None
    live: bool                    # some round on the page is still running


def rounds_page(reply: pb.ListRoundsReply, limit: int, before: str | None) -> RoundsPage:
    rows = [round_row(r) for r in reply.rounds]
    return RoundsPage(rows=rows, next_before=rows[-1].round_id if len(rows) >= limit else None,
                      before=before, live=any(not r.final for r in rows))


@dataclass(frozen=True)
class PhaseRow:
    phase: str
    started: str
    duration: str
    running: bool


@dataclass(frozen=True)
class RoundSite:
    """One invited site's part in a round: its outcome and why."""
    site_id: str
    outcome: str          # released, refused, dropped, left out, waiting, consented
    detail: str = ""      # why (a refusal's reason, what dropped means), or what it waits for
    n: int | None = None
    epsilon: float | None = None
    when: str = ""
    hidden: str = ""


@dataclass(frozen=True)
class RoundDetail:
    round_id: str
    state: str
    final: bool
    message: str
    started: str
    deadline: str
    consent_deadline: str
    coordinator_id: str
    target: str
    features: list[str]
    epsilon: float
    neighbouring: str
    aggregation: str
    quorum: int
    phases: list[PhaseRow]
    sites: list[RoundSite]
    counts: dict[str, int]
    round_seconds: float
    fit_seconds: float
    spec_digest: str
    epsilon_spent: float           # by every site that released or debited a refusal, known here


def round_detail(status: pb.RoundStatus) -> RoundDetail:
    state = state_name(status.state)
    final = state in FINAL_STATES
    phases = [PhaseRow(p.phase, utc(p.started_unix_ms),
                       seconds(p.seconds) if p.seconds else "running",
                       not p.seconds and not final) for p in status.phases]
    contributions = {c.site_id: c for c in status.contributions}
    refusals = {r.site_id: r for r in status.refusals}
    consented, dropped = set(status.consented), set(status.dropped)
    missing = set(status.missing_sites)
    consent_over = state not in ("CONSENT",)
    invited = list(status.invited) or sorted({*contributions, *refusals, *consented, *missing})
    sites: list[RoundSite] = []
    for site in invited:
        if site in contributions:
            c = contributions[site]
            sites.append(RoundSite(site, "released", hidden=c.hidden) if c.hidden else
                         RoundSite(site, "released", n=c.n, epsilon=c.epsilon_spent,
                                   when=utc(c.received_unix_ms)))
        elif site in refusals:
            r = refusals[site]
            sites.append(RoundSite(site, "refused", r.reason, epsilon=r.epsilon_spent or None,
                                   hidden=r.hidden))
        elif site in dropped:
            sites.append(RoundSite(site, "dropped", "consented, then sent no release before "
                                                    "the deadline"))
        elif site in missing:
            sites.append(RoundSite(site, "waiting", "release" if site in consented else
                                   "consent"))
        elif site in consented:
            sites.append(RoundSite(site, "consented",
                                   "" if not final else "consented; not selected"))
        elif state == "FAILED":
            sites.append(RoundSite(site, "no answer", "the round failed before this site "
                                                      "answered"))
        elif consent_over:
            sites.append(RoundSite(site, "left out", "did not answer the consent request "
                                                     "before the consent deadline"))
        else:
            sites.append(RoundSite(site, "waiting", "consent"))
    counts = {k: sum(s.outcome == k for s in sites)
              for k in ("released", "refused", "dropped", "left out", "no answer", "waiting")}
    counts["invited"] = len(invited)
    counts["consented"] = len(consented)
    spec = status.spec
    spent = sum(s.epsilon or 0.0 for s in sites if s.outcome in ("released", "refused"))
    return RoundDetail(
        round_id=status.round_id, state=state, final=final, message=status.message,
        started=utc(status.started_unix_ms), deadline=utc(status.deadline_unix_ms),
        consent_deadline=utc(spec.consent_deadline_unix_ms), coordinator_id=spec.coordinator_id,
        target=spec.target or (f"{len(spec.targets)} targets ({spec.mechanism or 'laplace'})"
                               if spec.targets else ""),
        features=list(spec.feature_names), epsilon=spec.epsilon,
        neighbouring=spec.neighbouring or "add_remove",
        aggregation=spec.aggregation or "independent", quorum=status.quorum, phases=phases,
        sites=sites, counts=counts, round_seconds=status.round_seconds,
        fit_seconds=status.fit_seconds, spec_digest=status.spec_digest, epsilon_spent=spent)


# ---- results --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoefficientRow:
    name: str
    mean: float | None
    sd: float | None
    lower: float | None
    upper: float | None
    excludes_zero: bool


@dataclass(frozen=True)
class ResultView:
    round_id: str
    target: str
    rows: list[CoefficientRow]
    n_total: int | None
    n_public: int
    model: str
    noise: str
    fit_method: str
    verdict: str
    statement: str
    warning: bool
    snr: float | None
    snr_reference: float | None
    agreement: float | None
    reference: str
    plot_svg: str
    has_reference_plot: bool
    sites: list[dict] = field(default_factory=list)
    # A joint round: one row per target (empty otherwise), and the target shown, if any.
    targets: list[TargetRow] = field(default_factory=list)
    shown_target: str = ""


@dataclass(frozen=True)
class TargetRow:
    """One target of a joint round's result (docs/protocol.md "Joint rounds")."""
    target: str
    n: int | None
    n_public: int
    status: str
    model: str
    strongest: str
    verdict: str
    error: str


def _num(v):
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def target_summary(summary: dict, name: str) -> dict | None:
    """One target of a joint round's summary as a single round's summary (the fields
    ``result_view`` and ``dpfed round result`` read), or None if the round has no such
    target."""
    for e in summary.get("targets") or []:
        if isinstance(e, dict) and e.get("target") == name:
            return {**{k: v for k, v in summary.items() if k != "targets"}, **e,
                    "joint": False, "n_total": e.get("n"),
                    "round_id": summary.get("round_id", "")}
    return None


def strongest_coefficient(entry: dict, names: list) -> str:
    """The coefficient of largest |posterior mean| with its 90 % interval."""
    mean = [_num(v) for v in entry.get("beta_mean") or []]
    if not mean or all(v is None for v in mean):
        return ""
    k = max(range(len(mean)), key=lambda i: abs(mean[i]) if mean[i] is not None else -1.0)
    ci = (entry.get("beta_ci90") or [[None, None]] * len(mean))[k] or [None, None]
    lo, hi = _num(ci[0]), _num(ci[1])
    name = str(names[k]) if k < len(names) else f"beta{k}"
    return f"{name} {mean[k]:+.3f}" + (f" [{lo:.2f}, {hi:.2f}]" if None not in (lo, hi) else "")


def target_rows(summary: dict) -> list[TargetRow]:
    """A joint round's targets, in spec order."""
    names = summary.get("feature_names") or []
    rows = []
    for e in summary.get("targets") or []:
        if not isinstance(e, dict):
            continue
        info = e.get("information") or {}
        rows.append(TargetRow(
            target=str(e.get("target", "")), n=e.get("n"), n_public=int(e.get("n_public") or 0),
            status=str(e.get("status", "")), model=str(e.get("model") or ""),
            strongest=strongest_coefficient(e, names), verdict=str(info.get("verdict") or ""),
            error=str(e.get("error") or "")))
    return rows


def result_view(summary: dict) -> ResultView:
    """The result of a round from its summary JSON (aggregator.aggregate.summarize). A joint
    round's (aggregator.rounds.fitting.fit_joint_round): its targets in ``targets`` (the
    coefficients of one are ``result_view(target_summary(summary, name))``)."""
    from dpfed_apps.console.plot import interval_plot

    mean = summary.get("beta_mean") or []
    dim = len(mean)
    names = summary.get("feature_names") or [f"beta{i}" for i in range(dim)]
    sd = summary.get("beta_sd") or [None] * dim
    ci = summary.get("beta_ci90") or [[None, None]] * dim
    rows = []
    for name, m, s, iv in zip(names, mean, sd, ci):
        lo, hi = (_num(iv[0]), _num(iv[1])) if iv else (None, None)
        rows.append(CoefficientRow(str(name), _num(m), _num(s), lo, hi,
                                   lo is not None and hi is not None and (lo > 0 or hi < 0)))
    info = summary.get("information") or {}
    reference = info.get("reference_beta_ci90")
    if not (isinstance(reference, list) and len(reference) == dim):
        reference = None
    svg = interval_plot([r.name for r in rows], [r.mean for r in rows],
                        [(r.lower, r.upper) for r in rows], reference=reference,
                        reference_label=f"posterior of {info.get('reference') or 'the public rows alone'}"
                        if reference else "")
    verdict = str(info.get("verdict") or "unknown")
    return ResultView(
        round_id=str(summary.get("round_id", "")), target=str(summary.get("target", "")),
        rows=rows, n_total=summary.get("n_total"), n_public=int(summary.get("n_public") or 0),
        model=str(summary.get("model") or ""), noise=str(summary.get("noise") or ""),
        fit_method=str(summary.get("fit_method") or ""), verdict=verdict,
        statement=str(info.get("text") or "The result carries no quality statement."),
        warning=verdict in ("little", "unknown"), snr=_num(info.get("snr")),
        snr_reference=_num(info.get("snr_reference")), agreement=_num(info.get("agreement")),
        reference=str(info.get("reference") or ""), plot_svg=svg,
        has_reference_plot=reference is not None, sites=list(summary.get("sites") or []),
        targets=target_rows(summary) if summary.get("joint") else [])


def joint_result_view(summary: dict, target: str | None) -> ResultView:
    """A joint round's result page: the table of its targets, and the coefficients and plot
    of ``target`` (the first fitted one when None or unknown)."""
    rows = target_rows(summary)
    fitted = [r.target for r in rows if r.status == "fitted"]
    name = target if target in fitted else (fitted[0] if fitted else None)
    one = target_summary(summary, name) if name else None
    base = result_view(one if one is not None else {**summary, "joint": False})
    import dataclasses
    return dataclasses.replace(base, targets=rows, shown_target=name or "",
                               target=name or f"{len(rows)} targets")


# ---- forecast ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ForecastView:
    epsilon: float
    sites: int
    n_per_site: list[int]
    gain_mean: float | None
    gain_q10: float | None
    gain_q90: float | None
    p_positive: float | None
    public_only: float | None
    private_public: float | None
    nonprivate: float | None
    made: str
    note: str
    # A Gaussian or joint round (issue 23): the forecast is for one target of `targets`.
    mechanism: str = "laplace"
    delta: float = 0.0
    targets: int = 1
    joint: bool = False
    target: str = ""


def forecast_view(record: dict | None) -> ForecastView | None:
    """The forecast kept for a round (dpfed_apps.console.forecasts) for one epsilon."""
    if not record or not (record.get("forecast") or {}).get("per_epsilon"):
        return None
    f = record["forecast"]
    e = f["per_epsilon"][0]
    g = e.get("gain") or {}
    return ForecastView(
        epsilon=float(e.get("epsilon", 0.0)), sites=int(f.get("sites", 0)),
        n_per_site=[int(v) for v in f.get("n_per_site", [])], gain_mean=_num(g.get("mean")),
        gain_q10=_num(g.get("q10")), gain_q90=_num(g.get("q90")),
        p_positive=_num(g.get("p_positive")),
        public_only=_num((e.get("spearman_public_only") or {}).get("mean")),
        private_public=_num((e.get("spearman_private_public") or {}).get("mean")),
        nonprivate=_num((e.get("spearman_nonprivate") or {}).get("mean")),
        made=utc(int(record.get("made_unix_ms", 0))), note=str(record.get("note", "")),
        mechanism=str(f.get("mechanism", "laplace")), delta=float(f.get("delta") or 0.0),
        targets=int(f.get("targets") or 1), joint=bool(f.get("joint_release", False)),
        target=str(f.get("target") or ""))
