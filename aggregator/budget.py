"""The aggregator's record of each site's spending and declarations, and who may read what.

Defence in depth for the site's privacy ledger (docs/security.md, "Budget history"): the
ledger at the site is the authority on its budget, but a deleted or replaced ledger forgets
what was spent. The aggregator holds every accepted contribution (and every refusal that
debited, Refusal.epsilon_spent) in its store, so it knows a lower bound of what each site
has spent; ``SiteBudgets`` keeps that sum in memory, loaded from the store at start and
advanced only when a contribution is durable. Each site declares in its signed SiteHello
(on Subscribe) its total budget and the key ids of the coordinators it trusts; both are kept
in the store (table site_declarations, one row per change: the history).

* A contribution that would take a site's recorded spend (plus contributions being stored)
  beyond its declared total is refused (``reserve``): nothing is stored.
* A hello whose declared total is lower than what is already recorded as spent is accepted
  (a lower total is more conservative, and the site still needs its stream to refuse
  rounds); every further contribution is then refused by the check above. A raised total is
  accepted too (the site records an explicit raise in its ledger, ``dpfed site ledger
  --raise-total``) and logged; the declarations table keeps the history.
* ``hidden`` decides whether a coordinator may see one site's entries (n, epsilon, refusal
  reason, listing): only coordinators whose key the site declared as trusted. A site that
  never declared (older software) is shown only to the coordinator of the round (it answered
  that coordinator's signed spec); its listing to nobody. Without TLS there is no reader
  identity and everything is shown (``insecure``, local tests only).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from dpfed.v1 import dpfed_pb2 as pb

log = logging.getLogger(__name__)

# Floating-point slack on the total check, as in the site's ledger.
SLACK = 1e-9


@dataclass
class SiteBudget:
    spent: float = 0.0          # durable: accepted contributions + debited refusals
    rounds: int = 0
    last_ms: int = 0
    pending: float = 0.0        # contributions admitted and being stored
    declared_total: float = 0.0  # 0: never declared
    trusted: frozenset[str] | None = None   # coordinator key ids; None: never declared


class SiteBudgets:
    def __init__(self, store):
        self.store = store
        self._lock = threading.Lock()
        self._sites: dict[str, SiteBudget] = {}
        for site, (spent, rounds, last_ms) in store.site_spending().items():
            self._sites[site] = SiteBudget(spent, rounds, last_ms)
        for site, (total, trusted) in store.declarations().items():
            b = self._site(site)
            b.declared_total, b.trusted = total, frozenset(trusted)

    def _site(self, site_id: str) -> SiteBudget:
        b = self._sites.get(site_id)
        if b is None:
            b = self._sites[site_id] = SiteBudget()
        return b

    # ---- declarations ----
    def declare(self, hello: pb.SiteHello, envelope: pb.SignedEnvelope, now_ms: int) -> None:
        """Record what ``hello`` declares, if it declares anything and it changed (durably
        first). A hello of an older site (nothing declared) leaves the last declaration."""
        trusted = frozenset(hello.trusted_coordinator_key_ids)
        total = float(hello.total_epsilon)
        if total <= 0 and not trusted:
            return
        with self._lock:
            b = self._site(hello.site_id)
            if b.declared_total == total and b.trusted == trusted:
                return
            self.store.insert_declaration(hello.site_id, total, sorted(trusted),
                                          envelope.SerializeToString(), now_ms)
            old = b.declared_total
            b.declared_total, b.trusted = total, trusted
            spent = b.spent
        if old and total > old + SLACK:
            log.warning("site %s declares a RAISED total budget: epsilon %g (was %g); spent %g",
                        hello.site_id, total, old, spent)
        if total and spent > total + SLACK:
            log.warning("site %s declares total epsilon %g, below the %g it has already spent "
                        "(recorded here): its further contributions are refused",
                        hello.site_id, total, spent)

    def history(self, site_id: str) -> pb.SiteHistory:
        with self._lock:
            b = self._sites.get(site_id) or SiteBudget()
            return pb.SiteHistory(site_id=site_id, spent_epsilon=b.spent, rounds=b.rounds,
                                  declared_total_epsilon=b.declared_total,
                                  last_unix_ms=b.last_ms)

    def spending(self, site_id: str) -> pb.SiteSpending:
        """``site_id``'s spending round by round, from the store (GetSiteSpending; the caller
        checks who may read it with ``hidden``)."""
        b = self.view(site_id)
        return pb.SiteSpending(
            site_id=site_id, spent_epsilon=b.spent, declared_total_epsilon=b.declared_total,
            rounds=[pb.SiteRoundSpend(round_id=r, epsilon=e, received_unix_ms=ms, refused=refused)
                    for r, e, ms, refused in self.store.site_rounds(site_id)])

    def view(self, site_id: str) -> SiteBudget:
        with self._lock:
            b = self._sites.get(site_id) or SiteBudget()
            return SiteBudget(b.spent, b.rounds, b.last_ms, b.pending, b.declared_total,
                              b.trusted)

    # ---- spending ----
    def reserve(self, site_id: str, epsilon: float, round_id: str) -> str | None:
        """Hold ``epsilon`` for a contribution being stored; the reason it is refused (beyond
        the declared total), or None. Nothing is held when refused."""
        with self._lock:
            b = self._site(site_id)
            after = b.spent + b.pending + epsilon
            if b.declared_total > 0 and after > b.declared_total + SLACK:
                return (f"contribution of site {site_id!r} to round {round_id!r} would take its "
                        f"cumulative epsilon to {after:g}, beyond the total budget "
                        f"{b.declared_total:g} it declared (the aggregator records epsilon "
                        f"{b.spent:g} spent over {b.rounds} round(s)"
                        + (f", {b.pending:g} being stored" if b.pending else "")
                        + "); nothing stored")
            b.pending += epsilon
            return None

    def release(self, site_id: str, epsilon: float) -> None:
        with self._lock:
            b = self._site(site_id)
            b.pending = max(0.0, b.pending - epsilon)

    def commit(self, site_id: str, epsilon: float, received_ms: int, *,
               reserved: bool = True) -> None:
        """``epsilon`` is durable in the store (a contribution, or a refusal that debited)."""
        with self._lock:
            b = self._site(site_id)
            if reserved:
                b.pending = max(0.0, b.pending - epsilon)
            b.spent += epsilon
            b.rounds += 1
            b.last_ms = max(b.last_ms, received_ms)

    # ---- who may read a site's entries ----
    def hidden(self, site_id: str, reader: str | None, reader_key_id: str | None,
               round_coordinator: str | None = None) -> str | None:
        """Why coordinator ``reader`` (key ``reader_key_id``) may not see ``site_id``'s
        entries, or None. ``reader`` None: no reader identity (plaintext), all shown.
        ``round_coordinator``: the coordinator of the round being read, if any."""
        if reader is None:
            return None
        with self._lock:
            b = self._sites.get(site_id)
            trusted = None if b is None else b.trusted
        if trusted is None:
            if round_coordinator is not None and reader == round_coordinator:
                return None
            return (f"hidden: site {site_id!r} has not declared which coordinators it trusts "
                    f"(older site software): only a round's own coordinator sees its entries")
        if reader_key_id is not None and reader_key_id in trusted:
            return None
        return f"hidden: site {site_id!r} does not trust coordinator {reader!r}"
