"""A budget per patient (issue 23 part 1; docs/method.md section 13, "A budget per patient").

The unit of privacy is the patient. The ledger (site_node.ledger) keeps, for each patient, the
privacy events of every release that included them; a release includes only the patients
whose own history still admits its event (an *individual filter*: Ebadi, Sands & Schneider,
POPL 2015, "Differential privacy: now it's getting personal" (ProPer); Feldman & Zrnic,
NeurIPS 2021, "Individual privacy accounting via a Renyi filter"). This module holds the
pieces that are not SQL:

* ``PatientHasher``: a patient's ledger key, HMAC-SHA256(site secret, id). The secret is 32
  bytes from the OS CSPRNG, created on first use next to the ledger with mode 0600, and never
  sent. Keyed, not a plain hash: hospital ids come from small, structured spaces (a medical
  record number of 7-10 digits), so SHA-256(id) can be inverted by hashing every candidate id;
  with the key, a copy of the ledger alone tells nothing about who is in it.
* ``PatientBudget``: the filter. Pure eps (today's releases): the sum of a patient's PureDP
  events plus the new one must stay within ``epsilon`` (basic composition, a valid filter
  under adaptively chosen epsilons: Rogers, Roth, Ullman & Vadhan 2016; ProPer). With a
  ``delta`` (``[policy] patient_delta``; needed for Gaussian rounds): the individual Renyi
  filter at one order ``alpha`` fixed with the budget (Feldman & Zrnic 2021; ``dpfed.
  accounting.renyi_filter_admits``; the order from ``renyi_order``, kept in the ledger),
  valid for any mix of PureDP / Gaussian / zCDP / Skellam events. The ledger sums each
  patient's eps_alpha in SQL (``admits_renyi`` is the rule on that sum).
  ``dpfed.accounting.admits`` (the minimum of several bounds) is *not* used as the filter:
  it is not known to be a valid filter under adaptive choice (docs/method.md section 13).
* ``event_to_json`` / ``event_from_json``: the ledger stores every release's event in the
  accountant's own terms (PureDP today; Gaussian, ZCDP, Skellam later), so a patient's history
  can be replayed through ``dpfed.accounting`` (tests/test_patient_budget.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from dpfed.accounting import (ALPHAS, ZCDP, Gaussian, PrivacyEvent, PureDP, Skellam, compose,
                              rdp, renyi_budget, renyi_filter_admits)

__all__ = ["PatientHasher", "PatientBudget", "PatientKeyError", "event_to_json",
           "event_from_json", "key_path_for", "normalise_id", "renyi_order"]

# Floating-point slack of the pure-eps filter (as the site-wide budget: 10 releases of 0.1
# fit in 1.0).
BUDGET_SLACK = 1e-9
KEY_BYTES = 32
# HMAC of this constant under the key: kept in the ledger so a lost or replaced key file is
# detected (every patient would otherwise start again with a full budget).
_FINGERPRINT_INPUT = b"dpfed patient key fingerprint v1"


class PatientKeyError(RuntimeError):
    """The site's patient key is missing, unreadable or not the ledger's."""


def key_path_for(state_db: Path) -> Path:
    """Where the patient key of the ledger ``state_db`` lives: beside it."""
    state_db = Path(state_db)
    return state_db.with_name(state_db.name + ".patient-key")


def normalise_id(value) -> str:
    """The text of an id cell as the ledger keys it: strings stripped, numbers as Python prints
    them (a Parquet 7 and a CSV "7" are the same patient; 7.0 is not "7")."""
    if isinstance(value, str):
        return value.strip()
    return str(value)


class PatientHasher:
    """HMAC-SHA256 with the site's secret patient key (module docstring)."""

    def __init__(self, key: bytes):
        if len(key) != KEY_BYTES:
            raise PatientKeyError(f"a patient key has {KEY_BYTES} bytes, got {len(key)}")
        self._key = key

    @classmethod
    def load_or_create(cls, path: Path, *, create: bool) -> "PatientHasher":
        """The key in ``path``; a new one (mode 0600, O_EXCL) only when ``create`` (the ledger
        has no patient records yet). Refuses a key file readable by others."""
        path = Path(path)
        if not path.exists():
            if not create:
                raise PatientKeyError(
                    f"the patient key {path} is missing, but the privacy ledger holds "
                    f"per-patient records made with it. Restore it from the backup of the "
                    f"state directory; a new key would give every patient a full budget again")
            key = os.urandom(KEY_BYTES)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, key)
                os.fsync(fd)
            finally:
                os.close(fd)
            return cls(key)
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise PatientKeyError(f"the patient key {path} has mode {mode:o}: it must be "
                                  f"readable by its owner only (chmod 600)")
        return cls(path.read_bytes())

    def fingerprint(self) -> str:
        return hmac.new(self._key, _FINGERPRINT_INPUT, hashlib.sha256).hexdigest()

    def key_of(self, patient_id) -> str:
        """The ledger key of one id (hex)."""
        return hmac.new(self._key, b"id:" + normalise_id(patient_id).encode("utf-8"),
                        hashlib.sha256).hexdigest()

    def keys_of(self, ids) -> list[str]:
        return [self.key_of(i) for i in ids]


@dataclass(frozen=True)
class PatientBudget:
    """A per-patient budget and its filter (module docstring). ``delta`` None: pure eps."""

    epsilon: float
    delta: float | None = None
    alpha: float | None = None   # the Renyi order of the (eps, delta) filter, fixed in advance

    def __post_init__(self):
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"a patient budget epsilon must be finite and > 0, "
                             f"got {self.epsilon!r}")
        if self.delta is not None and (self.alpha is None or not 0 < self.delta < 1):
            raise ValueError("an (eps, delta) patient budget needs 0 < delta < 1 and a Renyi "
                             "order alpha fixed with it")

    def admits(self, history, event: PrivacyEvent) -> bool:
        """Whether a patient with ``history`` (their events) may be in a release of ``event``."""
        if self.delta is None:
            events = [*history, event]
            if not all(isinstance(e, PureDP) for e in events):
                return False   # a pure-eps budget cannot account anything else (fail closed)
            return self.admits_pure(math.fsum(e.epsilon for e in history), event)
        return renyi_filter_admits(history, event, self.epsilon, self.delta, self.alpha)

    def admits_renyi(self, spent: float, event: PrivacyEvent) -> bool:
        """``admits`` for an (eps, delta) budget, given the history's Renyi divergence at the
        budget's order summed (``spent``; the ledger sums it in SQL for large sites): the
        filter's rule, spent + eps_alpha(event) <= renyi_budget(eps, delta, alpha)."""
        if self.delta is None:
            raise ValueError("admits_renyi is the (eps, delta) budget's rule")
        return math.fsum([spent, rdp(event, self.alpha)]) <= renyi_budget(
            self.epsilon, self.delta, self.alpha)

    def admits_pure(self, spent: float, event: PrivacyEvent) -> bool:
        """``admits`` for a pure-eps budget and a history of PureDP events whose epsilons sum
        to ``spent`` (the ledger sums them in SQL for large sites)."""
        if self.delta is not None or not isinstance(event, PureDP):
            raise ValueError("admits_pure is the pure-eps budget's rule for PureDP events")
        return spent + event.epsilon <= self.epsilon + BUDGET_SLACK

    def spent(self, history) -> float:
        """The epsilon a history has used: the pure sum, or (with delta) its eps at delta by
        ``dpfed.accounting.compose`` (a report, not the filter)."""
        history = list(history)
        if self.delta is None:
            if not all(isinstance(e, PureDP) for e in history):
                return math.inf
            return math.fsum(e.epsilon for e in history)
        return compose(history).epsilon(self.delta)

    def remaining(self, history) -> float:
        return max(0.0, self.epsilon - self.spent(history))


def renyi_order(epsilon: float, delta: float) -> float:
    """The Renyi order of an (eps, delta) per-patient budget's filter, fixed with the budget
    (Feldman & Zrnic 2021 need one order for the whole history): the order of
    ``dpfed.accounting.ALPHAS`` at which the filter admits the largest total zCDP, i.e. the
    largest renyi_budget(eps, delta, alpha) / alpha (a history of Gaussian / zCDP events of
    total rho has eps(alpha) = alpha rho). Public: a function of the budget only. Raises
    ValueError when no order admits anything (delta too small for eps)."""
    best, order = 0.0, None
    for a in ALPHAS:
        rho = renyi_budget(epsilon, delta, a) / a
        if rho > best:
            best, order = rho, a
    if order is None:
        raise ValueError(f"no Renyi order admits any release under a budget of eps "
                         f"{epsilon:g}, delta {delta:g}")
    return order


def event_to_json(event: PrivacyEvent) -> str:
    """The ledger's text of an accountant event (sorted keys: the same event, the same text)."""
    if isinstance(event, PureDP):
        body = {"kind": "pure", "epsilon": event.epsilon}
    elif isinstance(event, Gaussian):
        body = {"kind": "gaussian", "mu": event.mu}
    elif isinstance(event, ZCDP):
        body = {"kind": "zcdp", "rho": event.rho}
    elif isinstance(event, Skellam):
        body = {"kind": "skellam", "lam": event.lam, "l1": event.l1, "l2": event.l2}
    else:
        raise TypeError(f"not a privacy event: {event!r}")
    return json.dumps(body, sort_keys=True)


def event_from_json(text: str | None, epsilon: float) -> PrivacyEvent:
    """The event of a ledger debit; a debit without one (schema <= 3, a carried-over reset)
    was a pure-eps charge of ``epsilon``. An unknown kind raises ValueError (fail closed)."""
    if text is None:
        return PureDP(epsilon)
    body = json.loads(text)
    kind = body.get("kind")
    if kind == "pure":
        return PureDP(body["epsilon"])
    if kind == "gaussian":
        return Gaussian(body["mu"])
    if kind == "zcdp":
        return ZCDP(body["rho"])
    if kind == "skellam":
        return Skellam(body["lam"], body["l1"], body["l2"])
    raise ValueError(f"unknown privacy event kind {kind!r} in the ledger")
