"""Issue 19, item 3: no free answers about private data (method.md section 12).

A site's answers before anything is debited (consent, refusals) depend on public inputs only:
the signed spec, the site's policy and its budget. The row count is never compared with a
spec field (a secure round's max_site_rows only sizes the fixed-point grid: a site encodes
the exact statistics of all its usable rows, dpfed.secagg.exact), and a problem in a row
leaves that row out instead of refusing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node.config import load_config
from site_node.node import SiteNode
from tests.test_site_node import FEATURES, TARGET, write_site

POLICY = """
max_epsilon_per_round = 2.0
total_epsilon = 5.0
min_n = 20
max_noise_threshold = 3
"""
SITES = ["hospital-a", "hospital-b", "hospital-c", "hospital-d"]
CREATED = 1_700_000_000_000


def rows_text(n: int, *, extra: list[str] = (), seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    rows = ["id,g1,g2,g3,drug"]
    for i in range(n):
        x = rng.normal(size=3)
        rows.append(f"p{i},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum() + rng.normal():.4f}")
    return "\n".join([*rows, *extra]) + "\n"


# Data sets that differ in their number of (usable) rows, and in rows that must be left out
# rather than refused: n = 40 and 41, none, few, far more than any max_site_rows probed below,
# and 40 usable rows next to a NaN, an overflowing value, a text cell, a short line, a
# missing feature and a repeated id.
DATA = {
    "n=40": rows_text(40),
    "n=41": rows_text(41),
    "n=0": rows_text(0),
    "n=3": rows_text(3),
    "n=5000": rows_text(5000),
    "n=40+bad rows": rows_text(40, extra=["q1,nan,0.1,0.2,1.0", "q2,1e300,0.1,0.2,1.0",
                                          "q3,0.1,abc,0.2,1.0", "q4,0.1,0.2",
                                          "q5,0.1,,0.2,1.0", "p7,0.1,0.2,0.3,0.4",
                                          "q6,0.1,0.2,0.3,-inf"]),
}


def spec(round_id: str, **overrides) -> pb.RoundSpec:
    """A deterministic spec (fixed times), secure by default."""
    fields = dict(round_id=round_id, coordinator_id="coordinator", target=TARGET,
                  feature_names=FEATURES, epsilon=1.0, x_bound=0.5, y_bound=2.0,
                  budget_split=[0.30, 0.50, 0.05, 0.15],
                  preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, y_mean=0.0,
                                                 normalize_rows=True),
                  quorum=2, created_unix_ms=CREATED, sites=SITES, aggregation="secure",
                  noise_threshold=2, max_site_rows=100, colluders=0,
                  site_key_ids={s: "0" * 32 for s in SITES})
    fields.update(overrides)
    return pb.RoundSpec(**fields)


def answer_bytes(answer: pb.SignedEnvelope) -> bytes:
    """What the aggregator learns from an answer, less its timestamp, nonce and signature:
    the answer's type and, for a refusal, its reason and the epsilon it claims spent."""
    msg = parse_canonical(answer.payload, answer.payload_type)
    if answer.payload_type == "dpfed.v1.Refusal":
        return b"refusal:" + msg.reason.encode() + b":" + repr(msg.epsilon_spent).encode()
    assert answer.payload_type == "dpfed.v1.PhaseMessage", answer.payload_type
    return b"consent:" + msg.phase.encode() + b":" + msg.spec_digest.encode()


def probe(node: SiteNode, coordinator) -> list[bytes]:
    """An aggregator and coordinator hunting for the site's n with signed specs: a binary
    search over max_site_rows (secure rounds, T = 1 and T = 2), then sweeps of every other
    field the consent checks (epsilon, T, c, relation, rule, features, target, aggregation,
    the invited sites), each answered by the site's consent."""
    answers, count = [], iter(range(10 ** 6))

    def ask(**fields) -> bool:
        env = coordinator.sign(spec(f"probe-{next(count)}", **fields))
        out = answer_bytes(node.consent(env))
        answers.append(out)
        return out.startswith(b"consent:")

    for t in (1, 2):
        lo, hi = 1, 10 ** 6
        while lo < hi:   # "consent" read as n <= max_site_rows
            mid = (lo + hi) // 2
            if ask(max_site_rows=mid, noise_threshold=t):
                hi = mid
            else:
                lo = mid + 1
    for rows in (1, 2, 3, 39, 40, 41, 42, 100, 4999, 5000, 5001, 10 ** 9):
        ask(max_site_rows=rows)
    for eps in (0.1, 1.0, 2.0, 2.5, 5.0):
        ask(epsilon=eps)
    for t, c in ((1, 0), (2, 1), (3, 0), (3, 1), (4, 0)):
        ask(noise_threshold=t, colluders=c)
    ask(neighbouring="replace_one", budget_split=[0.35, 0.60, 0.05])
    ask(xtx_sensitivity="paper")
    ask(feature_names=["g1", "g9", "g3"])                          # a column the file lacks
    ask(feature_names=["g1", "id", "g3"])                          # the id column
    ask(target="g3", feature_names=["g1", "g2", "drug"])
    ask(aggregation="", noise_threshold=0, max_site_rows=0, colluders=0, site_key_ids={})
    ask(aggregation="", noise_threshold=0, max_site_rows=0, colluders=0, site_key_ids={},
        epsilon=0.3)
    ask(sites=["hospital-b", "hospital-c"])                         # not invited
    return answers


def test_a_binary_search_over_signed_specs_learns_nothing_about_n(tmp_path):
    """The sequence of answers (consent or the refusal's reason) to the same probing specs is
    byte for byte the same for data sets of 40, 41, 0, 3 and 5000 rows and for one with bad
    rows, and nothing is spent: the consent phase answers from public inputs only. Before
    issue 19 a site refused a secure round with more rows than max_site_rows ("the site has
    more usable rows than the round's public max_site_rows"): the binary search found n
    exactly, at 0 epsilon."""
    seen = {}
    for name, text in DATA.items():
        folder = tmp_path / name.replace("=", "").replace("+", "_").replace(" ", "_")
        folder.mkdir()
        config, coordinator, _ = write_site(folder, policy=POLICY, data_text=text)
        node = SiteNode(load_config(config))
        seen[name] = probe(node, coordinator)
        assert node.ledger.spent == 0 and node.ledger.releases() == []
    reference = seen["n=40"]
    assert any(a.startswith(b"consent:") for a in reference)
    assert any(a.startswith(b"refusal:") for a in reference)   # the sweeps do hit refusals
    for name, answers in seen.items():
        assert answers == reference, name


def test_a_secure_site_with_more_rows_than_max_site_rows_releases_all_of_them(tmp_path):
    """A real secure round over gRPC with max_site_rows = 125 and sites of 120, 130 and 140
    rows: every site consents and releases (no refusal: the sites above the bound answer
    exactly as the one below it), each site's input holds the exact statistics of *all* its
    rows (no cap: n = 120, 130, 140, and the encoding is bit for bit
    ``encode_exact(exact_clipped_statistics(every row))``), and the round completes."""
    from dpfed.preprocess import Preprocessing
    from dpfed.sensitivity import row_norm_bound
    from site_node.data import load_round_data
    from site_node.release import exact_clipped_statistics
    from tests.secure_federation import SecureFed, wait_state

    fed = SecureFed(tmp_path, 3)
    fed.start_aggregator()
    try:
        seen = {}
        for s in fed.sites:
            def hook(round_id, encoded, vector, s=s):
                seen[s] = np.array(encoded, dtype=np.uint64)
            fed.node(s).secure.on_release = hook
        fed.start_clients()
        coordinator = fed.coordinator()
        spec = fed.spec(t=2, quorum=3, rows=125)
        coordinator.start_round(spec)
        status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.DONE, pb.RoundStatus.FAILED),
                            timeout=40)
        assert status.state == pb.RoundStatus.DONE, status.message
        assert sorted(seen) == fed.sites and list(status.refusals) == []
        calibration = fed.manager.context.rounds["sec-1"].secure.calibration
        ns = {s: round(calibration.decode(seen[s])[1]) for s in fed.sites}
        assert ns == {"site-a": 120, "site-b": 130, "site-c": 140}
        pre = spec.preprocessing
        preprocessing = Preprocessing(tuple(pre.x_mean), pre.y_mean, pre.normalize_rows)
        for s in fed.sites:
            node = fed.node(s)
            data = load_round_data(node.config.data, list(spec.feature_names), spec.target)
            x, y = preprocessing.apply(data.x, data.y)
            stats = exact_clipped_statistics(x, y, spec.x_bound, spec.y_bound,
                                             row_norm_bound(pre.normalize_rows))
            assert stats.n == ns[s]
            assert np.array_equal(seen[s], calibration.encode_exact(stats))
        total = fed.manager.aggregated_statistics("sec-1")
        assert abs(total.n - 390) < 40 * calibration.grid_noise["n"]
    finally:
        fed.stop()


def test_secure_calibration_is_the_plain_relation_with_exact_statistics():
    """No row cap, so no price for it: the grid noise of a secure round is calibrated with
    the round's own add/remove sensitivities (Sxy d t By, not 2 d t By) and no floating-point
    error term (``statistics="exact"``: grid sensitivity ceil(s Delta) + m), and it does not
    depend on max_site_rows (which only sizes the grid)."""
    import math

    from dpfed import secure_round
    from dpfed.secagg.calibration import calibrate
    from dpfed.sensitivity import noise_calibration

    s = spec("r", preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, normalize_rows=False))
    grid = secure_round.build(s, SITES).calibration
    assert grid.statistics == "exact"
    plain = noise_calibration(3, 1.0, 0.5, 2.0, [0.30, 0.50, 0.05, 0.15])
    for part, m in (("xtx", 6), ("xty", 3), ("yty", 1)):
        delta = getattr(plain, f"{part}_sensitivity")
        assert grid.grid_sensitivities[part] == math.ceil(delta * grid.scales[part]) + m
    assert grid.real_noise_scales()["xty"] == pytest.approx(plain.xty_scale, rel=1e-4)
    assert grid.real_noise_scales()["xtx"] == pytest.approx(plain.xtx_scale, rel=1e-4)
    same = calibrate(d=3, n_max=100, n_sites=len(SITES), x_bound=0.5, y_bound=2.0,
                     calibration=plain, noise_threshold=2, statistics="exact")
    assert same.grid_noise == grid.grid_noise
    for rows in (1, 10 ** 6, 10 ** 9):      # max_site_rows moves neither scales nor noise
        other = secure_round.build(spec("r", max_site_rows=rows, preprocessing=s.preprocessing),
                                   SITES).calibration
        assert other.grid_noise == grid.grid_noise and other.scales == grid.scales
    # The float option keeps its error term, which grows with n_max.
    floats = [calibrate(d=3, n_max=m, n_sites=len(SITES), x_bound=0.5, y_bound=2.0,
                        calibration=plain, noise_threshold=2).grid_sensitivities["xtx"]
              for m in (100, 10 ** 9)]
    assert floats[0] >= grid.grid_sensitivities["xtx"] and floats[1] > floats[0]


def test_the_noisy_min_n_refusal_is_charged_once_and_never_redrawn(tmp_path):
    """Add/remove: the only refusal that depends on the rows is decided on the noisy n of a
    release already drawn; the ledger charges it, and every later ask (the same spec again,
    the release notice, a consent, a restarted node) gets the stored refusal or a consent,
    never a fresh draw and never a second charge."""
    from site_node.policy import NOISY_MIN_N_REASON
    from tests.test_site_node import _notice, make_spec

    config, coordinator, _ = write_site(tmp_path, data_text=rows_text(3), policy="""
max_epsilon_per_round = 200.0
total_epsilon = 500.0
min_n = 20
""")
    node = SiteNode(load_config(config))
    envelope = coordinator.sign(make_spec(epsilon=100.0))   # noisy n: 3 +- 0.07
    first = node.handle_round(envelope)
    refusal = parse_canonical(first.payload, "dpfed.v1.Refusal")
    assert refusal.reason == NOISY_MIN_N_REASON and refusal.epsilon_spent == 100.0
    assert node.ledger.spent == pytest.approx(100.0)
    same = first.SerializeToString()
    assert node.handle_round(envelope).SerializeToString() == same
    assert node.handle_notice(_notice(envelope, ["hospital-a"])).SerializeToString() == same
    assert node.consent(envelope).payload_type == "dpfed.v1.PhaseMessage"
    restarted = SiteNode(load_config(config))
    assert restarted.handle_round(envelope).SerializeToString() == same
    assert restarted.ledger.spent == pytest.approx(100.0)
    assert len(restarted.ledger.releases()) == 1
