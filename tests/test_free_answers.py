"""Issue 19, item 3: no free answers about private data (method.md section 12).

A site's answers before anything is debited (consent, refusals) depend on public inputs only:
the signed spec, the site's policy and its budget. The row count is never compared with a
spec field (a secure round's max_site_rows caps the rows by a keyed order instead:
site_node.rows), and a problem in a row leaves that row out instead of refusing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node.config import load_config
from site_node.data import load_round_data
from site_node.node import SiteNode
from site_node.rows import keep_at_most, row_order_key, row_tags
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


def test_the_keyed_row_order_is_deterministic_and_depends_only_on_the_round_id(tmp_path):
    """The rows a capped round keeps are chosen by HMAC tags of each row's own record under
    a key derived from the site's signing key and the round id: the same after a restart,
    the same whatever else the spec says (features, target, epsilon, bounds, max_site_rows:
    a larger cap keeps a superset), different for another round id or another site key."""
    config, _, _ = write_site(tmp_path, policy=POLICY, data_text=rows_text(60))
    node = SiteNode(load_config(config))
    key = node.row_order_key
    assert key == SiteNode(load_config(config)).row_order_key == row_order_key(node.signing_key)
    assert len(key) == 32 and key not in node.signing_key.private_key.private_bytes_raw()

    def file_rows_kept(round_id, features, target, m):
        data = load_round_data(node.config.data, features, target, digests=True)
        return {data.rows[i] for i in keep_at_most(m, key, round_id, data.digests)}

    a = file_rows_kept("r-1", FEATURES, TARGET, 25)
    assert len(a) == 25
    assert a == file_rows_kept("r-1", FEATURES, TARGET, 25)                 # deterministic
    assert a == file_rows_kept("r-1", ["g3", "g1"], TARGET, 25)             # other features
    assert a == file_rows_kept("r-1", ["g1", "g2"], "g3", 25)               # other target
    assert a < file_rows_kept("r-1", FEATURES, TARGET, 26)                  # nested in m
    assert a != file_rows_kept("r-2", FEATURES, TARGET, 25)                 # another round
    data = load_round_data(node.config.data, FEATURES, TARGET, digests=True)
    other = row_order_key(type(node.signing_key).generate())
    assert set(keep_at_most(25, other, "r-1", data.digests)) != \
        set(keep_at_most(25, key, "r-1", data.digests))                    # another site
    # A row's tag is of its own record: rows added before it change neither its digest nor
    # its tag, so they can push out at most one kept row (dpfed.sensitivity.capped_relation).
    tags = dict(zip(data.digests, row_tags(key, "r-1", data.digests)))
    text = node.config.data.path.read_text().split("\n")
    node.config.data.path.write_text("\n".join([text[0], "new1,0.1,0.2,0.3,1.0",
                                                 "new2,0.3,0.2,0.1,-1.0", *text[1:]]))
    more = load_round_data(node.config.data, FEATURES, TARGET, digests=True)
    assert more.n == data.n + 2
    assert all(tags[dg] == tag for dg, tag in zip(more.digests, row_tags(key, "r-1",
                                                                        more.digests))
               if dg in tags)
    assert set(tags) < set(more.digests)


def test_a_secure_site_with_more_rows_than_max_site_rows_keeps_that_many(tmp_path):
    """A real secure round over gRPC with max_site_rows = 125 and sites of 120, 130 and 140
    rows: every site consents and releases its masked input (no refusal), and the n inside
    each input is min(rows, 125)."""
    from tests.secure_federation import SecureFed

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
        coordinator.start_round(fed.spec(t=2, quorum=3, rows=125))
        # Every site released its masked input (the steps after the release are not what
        # this test is about).
        deadline = time.monotonic() + 40
        while len(seen) < len(fed.sites) and time.monotonic() < deadline:
            time.sleep(0.05)
        status = fed.manager.status("sec-1")
        assert sorted(seen) == fed.sites, status.message
        assert list(status.refusals) == []
        calibration = fed.manager._rounds["sec-1"].secure.calibration
        ns = {s: round(calibration.decode(seen[s])[1]) for s in fed.sites}
        assert ns == {"site-a": 120, "site-b": 125, "site-c": 125}
    finally:
        fed.stop()


def test_secure_calibration_prices_the_row_cap():
    """The grid noise of every secure round is calibrated with the row-cap sensitivities
    (dpfed.sensitivity.capped_relation): twice the add/remove Sxy noise."""
    from dpfed import secure_round
    from dpfed.secagg.calibration import calibrate
    from dpfed.sensitivity import noise_calibration

    s = spec("r", preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, normalize_rows=False))
    grid = secure_round.build(s, SITES).calibration
    for row_cap, same in ((True, True), (False, False)):
        cal = noise_calibration(3, 1.0, 0.5, 2.0, [0.30, 0.50, 0.05, 0.15], row_cap=row_cap)
        other = calibrate(d=3, n_max=100, n_sites=len(SITES), x_bound=0.5, y_bound=2.0,
                          calibration=cal, noise_threshold=2)
        # (grid units can agree when the fixed-point scale halves: compare real units)
        assert (other.real_noise_scales() == grid.real_noise_scales()) is same
    plain = noise_calibration(3, 1.0, 0.5, 2.0, [0.30, 0.50, 0.05, 0.15])
    assert grid.real_noise_scales()["xty"] == pytest.approx(2 * plain.xty_scale, rel=1e-3)
    assert grid.real_noise_scales()["xtx"] == pytest.approx(plain.xtx_scale, rel=1e-3)


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
