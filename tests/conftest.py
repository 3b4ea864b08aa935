"""Shared fixtures. `federation`: a real aggregator gRPC server on 127.0.0.1 (port 0) with
three registered sites and one coordinator, and helpers to sign what they send."""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

import numpy as np
import pytest

_CHECKOUT = Path(__file__).resolve().parents[1]


def _drop_foreign_editable_finders() -> None:
    """Test this checkout only. An editable install of *another* checkout of dpfed (e.g. a
    shared virtual environment used from a git worktree) adds a finder after the path-based
    one: a module missing here would be imported silently from there (a move that forgot an
    importer would pass). Drop such finders; one that maps to this checkout stays."""
    for finder in list(sys.meta_path):
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", "")), "MAPPING", None)
        if type(finder).__name__ != "_EditableFinder" and getattr(finder, "__name__", "") != \
                "_EditableFinder":
            continue
        if isinstance(mapping, dict) and any(
                not Path(path).resolve().is_relative_to(_CHECKOUT) for path in mapping.values()):
            sys.meta_path.remove(finder)


_drop_foreign_editable_finders()


class Federation:
    SITES = ("site-a", "site-b", "site-c")

    def __init__(self, tmp_path, **config):
        from dpfed.wire.signing import SigningKey
        self.tmp = tmp_path
        self.site_keys = {s: SigningKey.generate() for s in self.SITES}
        self.coordinator_key = SigningKey.generate()
        # The aggregator's identity key (signing_key): signs its secure-aggregation messages.
        self.aggregator_key = SigningKey.generate()
        for name, key in [*self.site_keys.items(), ("coordinator", self.coordinator_key),
                          ("aggregator", self.aggregator_key)]:
            key.save(tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
        self.raw = {"listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True,
                    "max_clock_skew_s": 60, "grace_s": 0.5, "signing_key": "aggregator.key",
                    "sites": [{"site_id": s, "public_key": f"{s}.pub"} for s in self.SITES],
                    "coordinators": [{"coordinator_id": "coord", "public_key": "coordinator.pub"}],
                    **config}
        self.server = None
        self._specs = {}   # round_id -> the last spec built for it (spec())
        self.start()

    def start(self):
        import grpc
        from aggregator.config import config_from_dict
        from aggregator.server import AggregatorServer
        from coordinator.client import Coordinator
        from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
        self.server = AggregatorServer(config_from_dict(self.raw, self.tmp))
        self.port = self.server.start()
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.AggregatorStub(self.channel)
        # The coordinator's own record of the sites' and the aggregator's keys: what a secure
        # round's spec pins.
        self.coordinator = Coordinator(self.address, self.coordinator_key, "coord",
                                       site_keys={s: k.key_id for s, k in self.site_keys.items()},
                                       aggregator_key=self.aggregator_key.key_id)

    def stop(self):
        self.channel.close()
        self.coordinator.close()
        self.server.stop(0.2)

    @property
    def manager(self):
        return self.server.manager

    def spec(self, round_id="r1", d=3, quorum=2, deadline_s=30.0, public=None, **kw):
        from dpfed.v1 import dpfed_pb2 as pb
        now = int(time.time() * 1000)
        fields = dict(round_id=round_id, coordinator_id="coord", target="y",
                      feature_names=[f"x{i}" for i in range(d)], epsilon=2.0, x_bound=0.5,
                      y_bound=2.0, budget_split=[0.35, 0.6, 0.03, 0.02], quorum=quorum,
                      deadline_unix_ms=now + int(deadline_s * 1000), created_unix_ms=now,
                      fit_method="laplace", fit_draws=200, fit_seed=1)
        spec = pb.RoundSpec(**{**fields, **kw})
        if public is not None:
            spec.public_statistics = public.to_bytes()
        self._specs[round_id] = spec
        return spec

    def start_round(self, spec, *, consent=True):
        """Start ``spec``; with ``consent`` every invited site consents at once, so the round
        is in its release phase when this returns (tests of the release phase)."""
        status = self.coordinator.start_round(spec)
        if consent:
            for site in (spec.sites or self.SITES):
                self.stub.SendPhase(self.consent(site, spec.round_id))
        return status

    def refusal(self, site, round_id, reason, **overrides):
        """A signed Refusal of ``site`` to ``round_id``."""
        from dpfed.v1 import dpfed_pb2 as pb
        fields = dict(round_id=round_id, site_id=site, spec_digest=self.spec_digest(round_id),
                      reason=reason, timestamp_unix_ms=int(time.time() * 1000),
                      nonce=secrets.token_hex(16))
        fields.update(overrides)
        return self.site_keys[site].sign(pb.Refusal(**fields))

    def consent(self, site, round_id, *, key=None, digest=None, **overrides):
        """A signed consent (PhaseMessage) of ``site`` to ``round_id``."""
        from dpfed.v1 import dpfed_pb2 as pb
        fields = dict(round_id=round_id, site_id=site, phase="consent",
                      spec_digest=digest if digest is not None else self.spec_digest(round_id),
                      timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16))
        fields.update(overrides)
        return (key or self.site_keys[site]).sign(pb.PhaseMessage(**fields))

    def spec_digest(self, round_id):
        return self.manager.status(round_id).spec_digest

    def contribution(self, site, round_id, stats, *, key=None, digest=None, **overrides):
        """A signed Contribution of ``stats`` from ``site``; ``overrides`` replace fields."""
        from dpfed.v1 import dpfed_pb2 as pb
        fields = dict(round_id=round_id, site_id=site, statistics=stats.to_bytes(), n=stats.n,
                      epsilon_spent=2.0,
                      spec_digest=digest if digest is not None else self.spec_digest(round_id),
                      timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16))
        # The noise the round's spec implies, as an honest site declares it (from the spec
        # built here, so it also works for an aggregator in another process).
        from aggregator.rounds import round_expected_noise
        from dpfed.noise import to_proto
        if round_id in self._specs:
            fields["noise"] = to_proto(round_expected_noise(self._specs[round_id]))
        elif self.server is not None and round_id in self.manager.context.rounds:
            fields["noise"] = to_proto(self.manager.expected_noise(round_id))
        fields.update(overrides)
        return (key or self.site_keys[site]).sign(pb.Contribution(**fields))


def fd_grad(f, u, h=1e-6) -> np.ndarray:
    """Central differences of the value of ``f(u) -> (value, gradient)``: the gradient the
    densities' analytic ones are checked against."""
    return np.array([(f(u + e)[0] - f(u - e)[0]) / (2 * h) for e in np.eye(u.size) * h])


def lam0_marginal(logp, beta, a) -> float:
    """log of the PyMC model's density ``logp`` at (beta, log lambda = a) with log lambda0
    integrated out on a fine grid: what the numpy densities (lambda0 in closed form) equal."""
    from scipy import integrate
    grid = np.linspace(-12.0, 8.0, 4001)
    vals = np.array([logp({"lam_log__": a, "lam0_log__": c, "beta": beta}) for c in grid])
    top = vals.max()
    return float(top + np.log(integrate.trapezoid(np.exp(vals - top), grid)))


def public_statistics(d=3, n=10, seed=0):
    """Exact statistics of n random rows (what a round's public statistics must be)."""
    from dpfed.statistics import exact_statistics
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return exact_statistics(x, x @ rng.normal(size=d) + rng.normal(size=n))


def random_statistics(d=3, n=50, seed=0):
    """A release-like Statistics value (noisy, exactly symmetric)."""
    from dpfed.statistics import Statistics
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d)) * 10
    return Statistics(np.triu(a) + np.triu(a, 1).T, rng.normal(size=d) * 5,
                      float(rng.normal() * 3 + 40), n)


@pytest.fixture
def federation(tmp_path):
    fed = Federation(tmp_path)
    yield fed
    if fed.server.server is not None:
        fed.stop()


@pytest.fixture
def y_units_seen(monkeypatch) -> list:
    """The ``y_unit`` of every ``posterior.fit_posterior`` call made while the test
    runs (callers that import it at call time see the spy), in call order."""
    import posterior

    seen: list = []
    real = posterior.fit_posterior

    def spy(*args, **kwargs):
        seen.append(kwargs.get("y_unit"))
        return real(*args, **kwargs)

    monkeypatch.setattr(posterior, "fit_posterior", spy)
    return seen
