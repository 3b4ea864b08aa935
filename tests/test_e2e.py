"""End to end: an aggregator and three site nodes as real processes, one round over gRPC.

Checks what no unit test can: the statistics each site recorded in its ledger are the ones
the aggregator stored, the model was fitted on exactly their sum plus the public statistics,
and `dpfed simulate --json` reports what it promises.
"""

import json

import numpy as np
import pytest

from dpfed_apps import simulation as sim
from dpfed.statistics import Statistics

pytestmark = pytest.mark.slow

SEED = 3
N_SITES = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `dpfed simulate --json` run (fixed-precision fit: seconds, not minutes)."""
    from dpfed_apps import cli

    workdir = tmp_path_factory.mktemp("federation")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--log-level", "WARNING", "simulate", "--json", "--fit-method", "laplace",
                         "--draws", "400", "--sites", str(N_SITES), "--seed", str(SEED),
                         "--workdir", str(workdir), "--timeout", "60",
                         "--aggregation", "independent"])
    return code, out.getvalue(), sim.FederationLayout(workdir)


def test_simulate_exits_zero_and_prints_one_json_object(run):
    code, stdout, _ = run
    assert code == 0
    result = json.loads(stdout)
    for key in ("round_id", "sites", "metrics", "timings"):
        assert key in result
    assert len(result["sites"]) == N_SITES
    for site in result["sites"]:
        assert set(site) >= {"site_id", "n", "epsilon"}
        assert site["epsilon"] == 2.0 and isinstance(site["n"], int)
        # Add/remove (the default): the reported n is the site's noisy n, discrete Laplace of
        # scale 1 / (p_n eps) around the planned n; 12 scales: P(exceeded) = e^-12.
        from dpfed.sensitivity import DEFAULT_SPLIT_ADD_REMOVE
        scale = 1 / (DEFAULT_SPLIT_ADD_REMOVE[3] * 2.0)
        assert abs(site["n"] - site["n_planned"]) <= 12 * scale
    for key in ("spearman_private", "spearman_nonprivate", "spearman_public_only"):
        assert -1.0 <= result["metrics"][key] <= 1.0
    assert set(result["timings"]) >= {"round_s", "fit_s"}
    # The forecast made before the round (public inputs only) travels with the result, and
    # the result says how much the private statistics added (issue 9).
    assert set(result["forecast"]["gain"]) >= {"mean", "q10", "q90"}
    assert result["forecast"]["gain"]["q10"] <= result["forecast"]["gain"]["mean"]
    assert result["information"]["verdict"] in ("little", "some", "substantial")
    assert result["model"] == "noise-aware"
    # The known signal: TP53-mutant lines resist Nutlin-3a (the private model's sign is left
    # to chance: its noise is drawn from a CSPRNG and cannot be seeded).
    assert result["metrics"]["spearman_nonprivate"] > 0.3
    assert result["nonprivate_beta_mean"][result["features"].index("TP53_mut")] > 0


def _site_releases(layout, round_id):
    from site_node.ledger import PrivacyLedger
    from dpfed.wire.canonical import parse_canonical

    releases = {}
    for name in sim.site_ids(N_SITES):
        ledger = PrivacyLedger(layout.site_db(name))
        try:
            stored = ledger.get_release(round_id)
            assert stored is not None, f"{name} has no release for {round_id}"
            assert ledger.spent == pytest.approx(2.0)
            contribution = parse_canonical(stored.envelope.payload, stored.envelope.payload_type)
        finally:
            ledger.close()
        assert contribution.site_id == name
        releases[name] = contribution.statistics
    return releases


def _aggregator_state(layout, round_id):
    from aggregator.store import RoundStore
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import parse_canonical

    store = RoundStore(layout.aggregator_db)
    try:
        stored_round = store.get_round(round_id)
        contributions = {c.site_id: c.statistics for c in store.contributions(round_id)}
    finally:
        store.close()
    envelope = pb.SignedEnvelope.FromString(stored_round.spec_envelope)
    spec = parse_canonical(envelope.payload, envelope.payload_type)
    return spec, contributions


def test_aggregate_is_exactly_site_releases_plus_public_statistics(run):
    from aggregator.aggregate import exact_sum, fit

    _, stdout, layout = run
    result = json.loads(stdout)
    round_id = result["round_id"]
    releases = _site_releases(layout, round_id)
    spec, received = _aggregator_state(layout, round_id)

    # What left each site is, byte for byte, what the aggregator stored.
    assert received == releases

    # The public statistics in the signed spec are the exact statistics of the public lines.
    problem = sim.gdsc_problem(1047)
    split = sim.split_rows(problem.n, n_sites=N_SITES, n_public=10, n_test=100, seed=SEED)
    prep = sim.public_preprocessing(problem, split)
    public = Statistics.from_bytes(spec.public_statistics)
    assert public == sim.training_statistics(problem, split.public, prep)

    # Each release's public noise description follows from the signed spec alone.
    from dpfed.noise import EXACT
    from dpfed.sensitivity import expected_noise, row_norm_bound
    noise = expected_noise(len(spec.feature_names), spec.epsilon, spec.x_bound, spec.y_bound,
                           list(spec.budget_split), neighbouring=spec.neighbouring,
                           xtx_sensitivity=spec.xtx_sensitivity,
                           x_norm_bound=row_norm_bound(spec.preprocessing.normalize_rows))
    public = public.with_noise(EXACT)
    parts = [Statistics.from_bytes(b, noise) for b in releases.values()]
    total = exact_sum(parts + [public])
    naive = sum(parts) + public
    assert total.n == result["n_total"] == sum(s["n"] for s in result["sites"]) + 10
    np.testing.assert_allclose(total.xtx, naive.xtx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(total.xty, naive.xty, rtol=1e-12, atol=1e-12)
    # The noise-aware posterior is a deterministic function of the total, its noise
    # description and the seed: the aggregator fitted on exactly this sum.
    assert total.noise.draws("xty") == N_SITES
    beta_mean, _, _ = fit(total, "laplace", 400, SEED, public=public, x_bound=spec.x_bound,
                          y_bound=spec.y_bound)
    assert np.array_equal(np.asarray(result["beta_mean"]), beta_mean)
    # And the private statistics are noisy: no site released its exact statistics.
    for name, rows in zip(sim.site_ids(N_SITES), split.sites):
        exact = sim.training_statistics(problem, rows, prep)
        assert not np.allclose(Statistics.from_bytes(releases[name]).xty, exact.xty)


def test_posterior_is_finite_and_predicts(run):
    _, stdout, layout = run
    result = json.loads(stdout)
    beta = np.asarray(result["beta_mean"])
    assert beta.shape == (10,) and np.all(np.isfinite(beta))
    for row in result["top_features"]:
        lo, hi = row["ci90"]
        assert lo <= row["mean"] <= hi
    problem = sim.gdsc_problem(1047)
    split = sim.split_rows(problem.n, n_sites=N_SITES, n_public=10, n_test=100, seed=SEED)
    prep = sim.public_preprocessing(problem, split)
    prediction = sim.FittedModel(beta).predict(prep.transform_x(problem.x[split.test]))
    assert prediction.shape == (100,) and np.all(np.isfinite(prediction))
    assert np.std(prediction) > 0


def test_child_processes_logged_and_stopped(run):
    _, _, layout = run
    logs = sorted(p.name for p in layout.logs.iterdir())
    assert logs == ["aggregator.log"] + [f"{n}.log" for n in sim.site_ids(N_SITES)]
    # The aggregator is gone: its port can be bound again.
    import socket
    import tomllib

    listen = tomllib.loads(layout.aggregator_config.read_text())["listen"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR tolerates closed connections in TIME_WAIT, not a live listener.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(listen.rsplit(":", 1)[1])))


def test_failed_round_exits_3_and_keeps_logs(tmp_path, capsys):
    """Sites whose policy caps eps per round below the round's eps refuse; the round fails,
    the command exits 3, prints the processes' last log lines and keeps the folder."""
    import unittest.mock

    from dpfed import exitcodes
    from dpfed_apps import cli

    original = sim.write_federation

    def strict_sites(*args, **kwargs):
        kwargs["epsilon"] = 0.5  # the sites' max_epsilon_per_round; the round asks for 2
        return original(*args, **kwargs)

    with unittest.mock.patch.object(sim.run, "write_federation", strict_sites):
        code = cli.main(["--log-level", "INFO", "simulate", "--fit-method", "laplace",
                         "--workdir", str(tmp_path), "--timeout", "30"])
    err = capsys.readouterr().err
    assert code == exitcodes.ROUND_FAILED
    assert "round failed" in err and "aggregator.log" in err and "site-1.log" in err
    assert (tmp_path / "logs" / "aggregator.log").exists()
    assert "refus" in (tmp_path / "logs" / "site-1.log").read_text().lower()


def test_federation_ran_over_mutual_tls(run):
    """simulate provisions a CA and kits; every config names them and none allows plaintext."""
    import tomllib

    _, _, layout = run
    agg = tomllib.loads(layout.aggregator_config.read_text())
    assert "insecure" not in agg and set(agg["tls"]) == {"ca_cert", "cert", "key"}
    for name in sim.site_ids(N_SITES):
        site = tomllib.loads(layout.site_config(name).read_text())
        assert "insecure" not in site and site["tls"]["cert"].endswith(f"{name}.pem")
    for log in layout.logs.iterdir():
        assert "plaintext" not in log.read_text().lower(), log


def test_audit_logs_of_the_sites_and_the_aggregator_match_over_mutual_tls(run):
    """Real processes over mutual TLS (issue 22, audit log): every message a site sent, the
    aggregator recorded receiving, and every push it recorded, the site recorded, by the
    same message digests; each log's chain and signed heads verify with its owner's key."""
    from dpfed import audit
    from dpfed.wire.signing import SigningKey

    _, _, layout = run
    agg_contents = audit.read(audit.default_path(layout.aggregator_db))
    agg_key = SigningKey.load(layout.signing_key("aggregator"))
    assert audit.verify(agg_contents, {agg_key.key_id: agg_key.public_key}).ok
    agg = audit.entries(agg_contents)
    for name in sim.site_ids(N_SITES):
        contents = audit.read(audit.default_path(layout.site_db(name)))
        key = SigningKey.load(layout.signing_key(name))
        assert audit.verify(contents, {key.key_id: key.public_key}).ok
        mine = audit.entries(contents)
        matched = audit.cross_check(mine, agg, theirs_peer=name)
        assert matched["matched"] >= 4, matched    # spec, consent, notice, release
        assert matched["missing_in_theirs"] == [] and matched["missing_in_ours"] == [], matched
