"""A budget per patient (issue 23 part 1): the individual filter through the real release path
(SiteNode.handle_round, central and secure), contribution bounding (missing / repeated ids
refused, naming the column and never a value), crash safety, the schema-3 migration, the
patient key, the ledger histogram, and a simulated year replayed through dpfed.accounting."""

from __future__ import annotations

import json
import logging
import os
import sqlite3

import numpy as np
import pytest

from dpfed.accounting import PureDP, compose
from dpfed.preprocess import Preprocessing
from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical
from site_node.config import ConfigError, load_config
from site_node.ledger import LedgerError, PrivacyLedger
from site_node.node import SiteNode
from site_node.patients import PatientBudget, event_from_json, event_to_json, key_path_for
from site_node.release import clipped_statistics
from tests.test_site_node import make_spec, write_site

POLICY = """
max_epsilon_per_round = {max_eps}
patient_epsilon = {patient}
min_n = 20
"""


def csv_of(ids, seed=0, extra_rows=()) -> str:
    """A CSV whose row for patient i is a function of i only (same row in every month)."""
    rows = ["id,g1,g2,g3,drug"]
    for i in ids:
        rng = np.random.default_rng([seed, int(i)])
        x = rng.normal(size=3)
        rows.append(f"P{i:05d},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum() + rng.normal():.4f}")
    rows.extend(extra_rows)
    return "\n".join(rows) + "\n"


def site_with(tmp_path, ids, *, max_eps=1.0, patient=2.0, policy=None):
    config_path, coordinator, _ = write_site(
        tmp_path, data_text=csv_of(ids),
        policy=policy or POLICY.format(max_eps=max_eps, patient=patient))
    return config_path, coordinator


def set_data(tmp_path, ids, **kw) -> None:
    (tmp_path / "data/site.csv").write_text(csv_of(ids, **kw))


def keys(node, ids) -> set[str]:
    return set(node.ledger.patient_hasher().keys_of([f"P{i:05d}" for i in ids]))


def released(answer) -> pb.Contribution:
    assert answer.payload_type == "dpfed.v1.Contribution", parse_canonical(
        answer.payload, answer.payload_type).reason
    return parse_canonical(answer.payload, "dpfed.v1.Contribution")


def exact_of(ids, spec) -> np.ndarray:
    """Sxy of the clipped, pre-processed rows of ``ids``, as the site computes it."""
    rows = [line.split(",") for line in csv_of(ids).strip().split("\n")[1:]]
    x = np.array([[float(v) for v in r[1:4]] for r in rows])
    y = np.array([float(r[4]) for r in rows])
    pre = spec.preprocessing
    x, y = Preprocessing(tuple(pre.x_mean), pre.y_mean, pre.normalize_rows).apply(x, y)
    _, sxy, _ = clipped_statistics(x, y, spec.x_bound, spec.y_bound, 1.0)
    return sxy


# -- the filter through the real release path ---------------------------------------------

def test_a_spent_patient_is_never_in_a_later_release_and_one_with_budget_is(tmp_path):
    """Budget 200, rounds of eps 100 (the wire's largest; Laplace scale ~0.1 on Sxy, n exact
    but with probability ~1e-6):
    patients 0-99 are in rounds 1 and 2, then spent; in round 3 (file: patients 0-199) only
    the new patients 100-199 are released, whose budget is whole. Checked on the ledger's
    records and on the released n and Sxy against the exact ones of the expected rows."""
    config_path, coordinator = site_with(tmp_path, range(100), max_eps=100.0, patient=200.0)
    node = SiteNode(load_config(config_path))
    for r in ("r1", "r2"):
        spec = make_spec(r, epsilon=100.0)
        c = released(node.handle_round(coordinator.sign(spec)))
        assert c.n == 100
        assert node.ledger.included_in(r) == keys(node, range(100))
    set_data(tmp_path, range(200))
    spec = make_spec("r3", epsilon=100.0)
    c = released(node.handle_round(coordinator.sign(spec)))
    assert node.ledger.included_in("r3") == keys(node, range(100, 200))
    assert c.n == 100
    sxy = Statistics.from_bytes(c.statistics).xty
    assert np.allclose(sxy, exact_of(range(100, 200), spec), atol=1.5)
    assert np.abs(sxy - exact_of(range(200), spec)).max() > 5.0
    # every patient's history: 0-99 spent (2e4), 100-199 one release (1e4)
    histories = node.ledger.all_patient_histories()
    assert len(histories) == 200
    spent = sorted(compose(h).pure_epsilon for h in histories.values())
    assert spent[:100] == [100.0] * 100 and spent[100:] == [200.0] * 100


def test_a_secure_round_encodes_only_the_patients_with_budget(tmp_path):
    """Two sites (per-patient budget 2, site-wide 5), two secure rounds of eps 2 over real
    gRPC: round 1 spends every patient; before round 2 site-a gets 15 new patients. The exact
    fixed-point statistics each site encodes in round 2 hold n = 15 at site-a and 0 at
    site-b, and each ledger charged round 2 to exactly its new patients."""
    from dpfed.secagg import fixedpoint as fp
    from tests.secure_federation import SecureFed, write_data
    fed = SecureFed(tmp_path, 2, policy_extra={"patient_epsilon": 2.0})
    fed.start_aggregator()
    try:
        seen = {}
        for s in fed.sites:
            fed.node(s).secure.on_release = \
                lambda rid, encoded, vector, s=s: seen.setdefault(rid, {}).__setitem__(
                    s, np.array(encoded, dtype=np.uint64))
        fed.start_clients()
        coordinator = fed.coordinator()
        for rid in ("sec-1", "sec-2"):
            if rid == "sec-2":   # 15 new patients at site-a (ids "99-0" .. "99-14")
                extra = tmp_path / "extra.csv"
                write_data(extra, 15, seed=99)
                with open(tmp_path / "site-a.csv", "a") as f:
                    f.write("".join(extra.read_text().splitlines(True)[1:]))
            coordinator.start_round(fed.spec(rid, t=2, quorum=2, epsilon=2.0))
            status = coordinator.wait(rid, 40, poll_s=0.05)
            assert status.state == pb.RoundStatus.DONE, status.message
            calibration = fed.manager.context.rounds[rid].secure.calibration
            n = {s: int(calibration.decode(fp.wrap_sum([v]))[1]) for s, v in seen[rid].items()}
            assert n == ({"site-a": 120, "site-b": 130} if rid == "sec-1"
                         else {"site-a": 15, "site-b": 0})
        node = fed.node("site-a")
        assert node.ledger.included_in("sec-2") == set(
            node.ledger.patient_hasher().keys_of([f"99-{i}" for i in range(15)]))
        assert fed.node("site-b").ledger.included_in("sec-2") == set()
    finally:
        fed.stop()


def test_inclusion_of_others_does_not_depend_on_one_patient(tmp_path):
    """Each patient's inclusion depends only on their own history: two sites whose data differ
    by one patient (P00007) answer the same four rounds, with new patients arriving; every
    release includes the same other patients."""
    runs = []
    for variant, base in (("with", range(40)), ("without", [i for i in range(40) if i != 7])):
        folder = tmp_path / variant
        folder.mkdir()
        config_path, coordinator = site_with(folder, base, max_eps=1.0, patient=2.5)
        node = SiteNode(load_config(config_path))
        included = []
        for month in range(4):
            ids = [i for i in range(40 + 20 * month) if not (variant == "without" and i == 7)]
            set_data(folder, ids)
            spec = make_spec(f"m{month}", epsilon=1.0)
            node.handle_round(coordinator.sign(spec))
            inc = node.ledger.included_in(f"m{month}")
            hasher = node.ledger.patient_hasher()
            names = {f"P{i:05d}" for i in range(200)}
            by_key = {hasher.key_of(n): n for n in names}
            included.append({by_key[k] for k in inc} - {"P00007"})
        runs.append(included)
    assert runs[0] == runs[1]
    assert runs[0][2] == {f"P{i:05d}" for i in range(40, 80)}   # 0-39 spent after 2 rounds


# -- contribution bounding -------------------------------------------------------------------

@pytest.mark.parametrize("extra, reason", [
    (["P00003,0.1,0.2,0.3,0.4"], "repeated patient ids in the id column 'id'"),
    ([",0.1,0.2,0.3,0.4"], "rows without a patient id in the id column 'id'"),
])
def test_repeated_or_missing_ids_refused_naming_the_column_never_a_value(tmp_path, caplog,
                                                                         extra, reason):
    config_path, coordinator = site_with(tmp_path, range(30))
    (tmp_path / "data/site.csv").write_text(csv_of(range(30), extra_rows=extra))
    node = SiteNode(load_config(config_path))
    caplog.set_level(logging.DEBUG)
    for answer in (node.consent(coordinator.sign(make_spec("r1"))),
                   node.handle_round(coordinator.sign(make_spec("r1")))):
        assert answer.payload_type == "dpfed.v1.Refusal"
        text = parse_canonical(answer.payload, "dpfed.v1.Refusal").reason
        assert reason in text
        assert "P00003" not in text and "0.1" not in text
    assert node.ledger.spent == 0 and node.ledger.get_release("r1") is None
    assert "P00003" not in caplog.text and "'id'" in caplog.text


def test_per_patient_config_needs_an_id_column_and_checks_its_keys(tmp_path):
    config_path, _ = site_with(tmp_path, range(30))
    text = config_path.read_text()
    no_id = tmp_path / "no_id.toml"
    no_id.write_text(text.replace('id_column = "id"\n', ""))
    with pytest.raises(ConfigError, match="needs data.id_column"):
        load_config(no_id)
    too_big = tmp_path / "big.toml"
    too_big.write_text(text.replace("max_epsilon_per_round = 1.0", "max_epsilon_per_round = 3.0"))
    with pytest.raises(ConfigError, match="exceeds policy.patient_epsilon"):
        load_config(too_big)
    typo = tmp_path / "typo.toml"
    typo.write_text(text.replace("patient_epsilon", "patient_epsilo"))
    with pytest.raises(ConfigError, match="patient_epsilo"):
        load_config(typo)
    config = load_config(config_path)
    assert config.policy.total_epsilon is None and config.policy.patient_epsilon == 2.0


def test_replace_one_refused_under_a_per_patient_budget(tmp_path):
    config_path, coordinator = site_with(tmp_path, range(30), policy=POLICY.format(
        max_eps=1.0, patient=2.0) + "allow_replace_one = true\n")
    node = SiteNode(load_config(config_path))
    answer = node.handle_round(coordinator.sign(make_spec(
        neighbouring="replace_one", budget_split=[0.3, 0.6, 0.1])))
    assert "reveal how many patients" in parse_canonical(answer.payload,
                                                         "dpfed.v1.Refusal").reason


# -- crash safety ----------------------------------------------------------------------------

def test_crash_between_debit_and_send_is_answered_with_the_stored_bytes(tmp_path):
    config_path, coordinator = site_with(tmp_path, range(50))
    envelope = coordinator.sign(make_spec("r1"))
    first = SiteNode(load_config(config_path)).handle_round(envelope)   # then the site dies
    node = SiteNode(load_config(config_path))                           # restarted
    again = node.handle_round(envelope)
    assert again.SerializeToString() == first.SerializeToString()
    histories = node.ledger.all_patient_histories()
    assert len(histories) == 50 and all(h == [PureDP(1.0)] for h in histories.values())


class _CrashingLedger(PrivacyLedger):
    def _store(self, *args, **kwargs):
        raise RuntimeError("power cut")


def test_crash_inside_the_transaction_charges_no_patient(tmp_path):
    config_path, coordinator = site_with(tmp_path, range(50))
    config = load_config(config_path)
    crashing = _CrashingLedger(config.state_db, site_id=config.site_id,
                               patient_epsilon=2.0)
    with pytest.raises(RuntimeError, match="power cut"):
        SiteNode(config, ledger=crashing).handle_round(coordinator.sign(make_spec("r1")))
    crashing.close()
    node = SiteNode(config)
    assert node.ledger.all_patient_histories() == {}
    assert node.ledger.spent == 0
    assert released(node.handle_round(coordinator.sign(make_spec("r1")))).n > 0


def test_a_concurrent_spend_is_caught_inside_the_transaction(tmp_path):
    """The filter ran, then another process spent the same patients: record_release re-checks
    every included patient under the write lock and writes nothing."""
    from site_node.ledger import BudgetExhausted
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", patient_epsilon=1.0)
    budget = ledger.patient_budget()
    env = pb.SignedEnvelope(payload=b"x", payload_type="dpfed.v1.Contribution")
    assert ledger.admitted(["a", "b"], PureDP(1.0), budget) == [True, True]
    ledger.record_release(round_id="other", spec_digest="d" * 64, epsilon=1.0, n=1,
                          envelope=env, patients=["b"], patient_budget=budget)
    with pytest.raises(BudgetExhausted, match="no longer covers"):
        ledger.record_release(round_id="r", spec_digest="e" * 64, epsilon=1.0, n=2,
                              envelope=env, patients=["a", "b"], patient_budget=budget)
    assert ledger.get_release("r") is None and ledger.included_in("r") == set()
    with pytest.raises(ValueError, match="twice"):
        ledger.record_release(round_id="r", spec_digest="e" * 64, epsilon=1.0, n=2,
                              envelope=env, patients=["a", "a"], patient_budget=budget)


# -- migration, key, histogram ----------------------------------------------------------------

def test_a_schema_3_ledger_charges_its_releases_to_every_patient(tmp_path):
    path = tmp_path / "v3.sqlite"
    conn = sqlite3.connect(str(path))
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE debits (id INTEGER PRIMARY KEY AUTOINCREMENT, round_id TEXT NOT NULL,
            epsilon REAL NOT NULL CHECK (epsilon > 0), reason TEXT NOT NULL,
            created_unix_ms INTEGER NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '3'), ('site_id', 's'),
                                ('total_epsilon', '10.0');
        INSERT INTO debits(round_id, epsilon, reason, created_unix_ms)
            VALUES ('old-1', 1.0, 'release', 1), ('old-2', 0.5, 'release', 2);
    """)
    conn.commit()
    conn.close()
    ledger = PrivacyLedger(path, site_id="s", total_epsilon=10.0, patient_epsilon=2.0)
    assert ledger._meta("schema_version") == "4" and ledger.spent == pytest.approx(1.5)
    budget = ledger.patient_budget()
    # any patient, including one never seen: 1.5 of 2.0 already charged
    assert ledger.admitted(["new"], PureDP(0.5), budget) == [True]
    assert ledger.admitted(["new"], PureDP(0.6), budget) == [False]
    assert ledger.patient_histories(["new"])["new"] == [PureDP(1.0), PureDP(0.5)]


def test_patient_key_is_private_bound_to_the_ledger_and_never_recreated(tmp_path):
    config_path, coordinator = site_with(tmp_path, range(30))
    config = load_config(config_path)
    node = SiteNode(config)
    key = key_path_for(config.state_db)
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    node.handle_round(coordinator.sign(make_spec("r1")))
    ledger_bytes = b"".join(p.read_bytes() for p in config.state_db.parent.glob("ledger.sqlite*"))
    assert b"P00003" not in ledger_bytes            # ids never stored, only keyed hashes
    node.ledger.close()
    original = key.read_bytes()
    key.unlink()
    with pytest.raises(LedgerError, match="missing"):
        SiteNode(config)
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    with pytest.raises(LedgerError, match="not the one"):
        SiteNode(config)
    key.write_bytes(original)
    key.chmod(0o644)
    with pytest.raises(LedgerError, match="chmod 600"):
        SiteNode(config)
    key.chmod(0o600)
    assert SiteNode(config).ledger.included_in("r1") == keys(node, range(30))


def test_patient_budget_is_never_raised_silently(tmp_path):
    from site_node.ledger import BudgetRaise
    path = tmp_path / "l.sqlite"
    PrivacyLedger(path, site_id="s", patient_epsilon=2.0).close()
    with pytest.raises(BudgetRaise, match="patient_epsilon"):
        PrivacyLedger(path, site_id="s", patient_epsilon=3.0)
    with PrivacyLedger(path, site_id="s", patient_epsilon=1.5) as ledger:
        assert ledger.patient_epsilon == 1.5
        assert ledger.raise_patient_budget(3.0, operator="ops") == 1.5
    with PrivacyLedger(path, site_id="s", patient_epsilon=3.0) as ledger:
        assert ledger.patient_epsilon == 3.0


def test_site_ledger_shows_a_histogram_of_remaining_budget_never_ids(tmp_path, capsys):
    from dpfed_apps.cli import main
    config_path, coordinator = site_with(tmp_path, range(40))
    node = SiteNode(load_config(config_path))
    node.handle_round(coordinator.sign(make_spec("r1", epsilon=1.0)))   # 0-39: 1 of 2 left
    set_data(tmp_path, range(60))
    node.handle_round(coordinator.sign(make_spec("r2", epsilon=1.0)))   # 0-39 spent, 40-59: 1
    set_data(tmp_path, range(70))
    node.handle_round(coordinator.sign(make_spec("r3", epsilon=0.5)))   # 40-59: 0.5, 60-69: 1.5
    hashes = set(node.ledger.all_patient_histories())
    node.ledger.close()
    capsys.readouterr()
    assert main(["site", "ledger", "--config", str(config_path), "--json"]) == 0
    out = capsys.readouterr().out
    patients = json.loads(out)["patients"]
    assert patients["patients"] == 70 and patients["budget_epsilon"] == 2.0
    assert [b["patients"] for b in patients["histogram"]] == [40, 20, 0, 10, 0]
    assert main(["site", "ledger", "--config", str(config_path)]) == 0
    text = capsys.readouterr().out
    assert "70 patient(s)" in text and "no budget left: 40" in text
    assert not any(h in out or h in text for h in hashes) and "P000" not in out + text


# -- a simulated year --------------------------------------------------------------------------

def test_a_simulated_year_keeps_answering_and_no_patient_exceeds_the_budget(tmp_path):
    """12 monthly rounds of eps 1 with a per-patient budget of 3 and no site-wide cap: 30 new
    patients a month, none leaving. The site answers every month, each patient is in at most
    3 releases, and a replay of the ledger (each patient's events from its records) through
    dpfed.accounting never exceeds the budget. A site-wide budget of 3 would have stopped
    after month 3. min_n 1 and half the epsilon on n (discrete Laplace scale 2): the noisy n
    of month 1's 30 patients falls below min_n with probability ~1e-7 (min_n 20 and scale
    6.7 refused month 1 in ~10 % of the runs)."""
    config_path, coordinator = site_with(
        tmp_path, range(30), policy=POLICY.format(max_eps=1.0, patient=3.0).replace(
            "min_n = 20", "min_n = 1"))
    node = SiteNode(load_config(config_path))
    budget = PatientBudget(3.0)
    split = [0.25, 0.20, 0.05, 0.50]
    for month in range(12):
        set_data(tmp_path, range(30 * (month + 1)))
        c = released(node.handle_round(coordinator.sign(make_spec(f"month-{month}",
                                                                  budget_split=split))))
        # the patients of the last three months (at most 90)
        assert len(node.ledger.included_in(f"month-{month}")) == 30 * min(3, month + 1)
        assert c.n > 0
    assert node.ledger.spent == pytest.approx(12.0)   # the site-wide sum goes on
    replay: dict[str, list] = {}
    for month in range(12):
        for p in node.ledger.included_in(f"month-{month}"):
            replay.setdefault(p, []).append(PureDP(1.0))
    histories = node.ledger.all_patient_histories()
    assert len(histories) == 360 and set(replay) == set(histories)
    for p, events in replay.items():
        assert histories[p] == events
        assert compose(events).epsilon(1e-9) <= budget.epsilon + 1e-9
        assert compose(events).pure_epsilon <= 3.0 + 1e-9
    assert sum(len(e) == 3 for e in replay.values()) == 300   # all but the last 2 months'
    # the ledger's filter (sums in SQL) is the rule PatientBudget.admits applies to histories
    for eps in (0.5, 1.0, 2.0, 3.0):
        assert node.ledger.admitted(list(histories), PureDP(eps), budget) == \
            [budget.admits(h, PureDP(eps)) for h in histories.values()]


def test_a_pure_budget_refuses_patients_with_any_other_event(tmp_path):
    """A history holding a non-pure event (a later Gaussian release) is not summed as if it
    were pure: the ledger falls back to the events and the pure budget refuses (fail closed)."""
    from dpfed.accounting import Gaussian
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", patient_epsilon=5.0)
    budget = ledger.patient_budget()
    env = pb.SignedEnvelope(payload=b"x", payload_type="dpfed.v1.Contribution")
    ledger.record_release(round_id="g", spec_digest="d" * 64, epsilon=0.1, n=1, envelope=env,
                          patients=["a"], event=Gaussian(0.1),
                          patient_budget=PatientBudget(5.0, delta=1e-6, alpha=8.0))
    assert ledger.admitted(["a", "b"], PureDP(1.0), budget) == [False, True]


def test_events_round_trip_through_the_ledger_text():
    from dpfed.accounting import ZCDP, Gaussian, Skellam
    for e in (PureDP(0.3), Gaussian(0.7), ZCDP(0.1), Skellam(100.0, 20.0, 5.0)):
        assert event_from_json(event_to_json(e), 1.0) == e
    assert event_from_json(None, 0.25) == PureDP(0.25)
    with pytest.raises(ValueError):
        event_from_json('{"kind": "laplace?"}', 1.0)
    pure = PatientBudget(1.0)
    assert not pure.admits([], Gaussian(0.1))            # a pure budget fails closed
    approx = PatientBudget(4.0, delta=1e-6, alpha=8.0)
    assert approx.admits([PureDP(1.0)], Gaussian(0.5))


# -- (eps, delta) per-patient budgets and Gaussian rounds (issue 23 parts 2-3) -----------------

DELTA_POLICY = """
max_epsilon_per_round = 1.0
patient_epsilon = 3.0
patient_delta = 1e-5
min_n = 1
"""


def joint_csv_of(ids) -> str:
    """A joint round's CSV (two drugs, one of them missing for every third patient); a
    patient's row is a function of its id only."""
    rows = ["id,g1,g2,g3,drug,drug2"]
    for i in ids:
        rng = np.random.default_rng([7, int(i)])
        x = rng.normal(size=3)
        second = "" if i % 3 == 0 else f"{x[0] - x[2]:.4f}"
        rows.append(f"P{i:05d},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum():.4f},{second}")
    return "\n".join(rows) + "\n"


def gaussian_joint_spec(round_id, epsilon=1.0, delta=1e-6):
    return make_spec(round_id, target="", epsilon=epsilon, mechanism="gaussian", delta=delta,
                     targets=[pb.TargetSpec(name="drug", y_mean=0.0, y_scale=2.0),
                              pb.TargetSpec(name="drug2", y_mean=0.0, y_scale=2.0)])


def test_the_eps_delta_filter_admits_until_the_renyi_budget_and_never_past_the_composed_one(
        tmp_path):
    """Nine Gaussian joint rounds of (eps 1, delta 1e-6) (mu = 0.237 each) under a per-patient
    (3, 1e-5) budget; 40 patients from the start, 20 more before round 5. Replaying the ledger
    through dpfed.accounting: each patient is admitted exactly while the Renyi filter at the
    ledger's fixed order allows it (7 rounds here), and no admitted history's composed eps at
    delta 1e-5 passes 3 (the 7th leaves 2.57; compose would allow 9: the filter's price for
    validity under adaptive choice, docs/method.md section 13)."""
    from dpfed.accounting import Gaussian, rdp, renyi_budget
    from dpfed.gaussian import mu_for_epsilon_delta
    from site_node.patients import renyi_order
    config_path, coordinator, _ = write_site(tmp_path, data_text=joint_csv_of(range(40)),
                                             policy=DELTA_POLICY)
    node = SiteNode(load_config(config_path))
    budget = node.ledger.patient_budget()
    assert (budget.epsilon, budget.delta, budget.alpha) == (3.0, 1e-5, renyi_order(3.0, 1e-5))
    event = Gaussian(mu_for_epsilon_delta(1.0, 1e-6))
    limit = renyi_budget(3.0, 1e-5, budget.alpha)
    hasher = node.ledger.patient_hasher()
    first, late = set(hasher.keys_of([f"P{i:05d}" for i in range(40)])), \
        set(hasher.keys_of([f"P{i:05d}" for i in range(40, 60)]))
    replay: dict[str, list] = {}
    for k in range(1, 10):
        if k == 5:
            (tmp_path / "data/site.csv").write_text(joint_csv_of(range(60)))
        rid = f"g{k}"
        answer = node.handle_round(coordinator.sign(gaussian_joint_spec(rid)))
        assert answer.payload_type in ("dpfed.v1.Contribution", "dpfed.v1.Refusal")
        included = node.ledger.included_in(rid)
        candidates = first | (late if k >= 5 else set())
        for p in candidates:
            history = replay.get(p, [])
            admits = sum(rdp(e, budget.alpha) for e in [*history, event]) <= limit
            assert (p in included) == admits, (rid, len(history))
            if p in included:
                replay.setdefault(p, []).append(event)
        assert included <= candidates
    assert {len(replay[p]) for p in first} == {7} and {len(replay[p]) for p in late} == {5}
    histories = node.ledger.all_patient_histories()
    for p, events in replay.items():
        assert histories[p] == events
        assert compose(events).epsilon(1e-5) <= 3.0
    assert compose([event] * 9).epsilon(1e-5) <= 3.0 < compose([event] * 10).epsilon(1e-5)
    assert node.ledger.spent == pytest.approx(9.0)   # the site-wide sum of the rounds' eps


def test_patient_delta_config_keys(tmp_path):
    config_path, _, _ = write_site(tmp_path, policy=DELTA_POLICY)
    assert load_config(config_path).policy.patient_delta == 1e-5
    text = config_path.read_text()
    for bad, why in ((DELTA_POLICY.replace("patient_epsilon = 3.0\n", "total_epsilon = 5.0\n"),
                      "patient_delta needs policy.patient_epsilon"),
                     (DELTA_POLICY.replace("1e-5", "1.5"), r"in \(0, 1\)")):
        config_path.write_text(text.replace(DELTA_POLICY, bad))
        with pytest.raises(ConfigError, match=why):
            load_config(config_path)


def test_patient_delta_is_never_loosened_silently(tmp_path):
    from dpfed.accounting import Gaussian
    from site_node.ledger import BudgetRaise
    path = tmp_path / "l.sqlite"
    env = pb.SignedEnvelope(payload=b"x", payload_type="dpfed.v1.Contribution")
    with PrivacyLedger(path, site_id="s", patient_epsilon=2.0) as ledger:   # pure, in use
        ledger.record_release(round_id="r", spec_digest="d" * 64, epsilon=0.5, n=1, envelope=env,
                              patients=["a"], patient_budget=ledger.patient_budget())
    with pytest.raises(BudgetRaise, match="weaker"):    # a delta added to a pure budget in use
        PrivacyLedger(path, site_id="s", patient_epsilon=2.0, patient_delta=1e-6)
    with PrivacyLedger(path, site_id="s", patient_epsilon=2.0) as ledger:
        assert ledger.raise_patient_delta(1e-6, operator="ops") is None
        alpha = ledger.patient_budget().alpha
    with pytest.raises(BudgetRaise, match="patient_delta"):
        PrivacyLedger(path, site_id="s", patient_epsilon=2.0, patient_delta=1e-5)
    with PrivacyLedger(path, site_id="s", patient_epsilon=1.5, patient_delta=1e-7) as ledger:
        budget = ledger.patient_budget()      # lowered: recorded; the order is kept
        assert (budget.epsilon, budget.delta, budget.alpha) == (1.5, 1e-7, alpha)
        # "a" (PureDP(0.5): RDP 0.457 at order 12) is past the Renyi budget 0.348 of
        # (1.5, 1e-7); "b" (nothing yet) admits a Gaussian(0.1) (0.06)
        assert ledger.admitted(["a", "b"], Gaussian(0.1), budget) == [False, True]
        kinds = [e["kind"] for e in ledger.budget_events()]
        assert "patient_delta_raised" in kinds and "patient_delta_lowered" in kinds
    with PrivacyLedger(path, site_id="s", patient_epsilon=1.5) as ledger:   # back to pure
        assert ledger.patient_delta is None
        assert ledger.admitted(["b"], Gaussian(0.1), ledger.patient_budget()) == [False]


def test_site_ledger_reports_composed_eps_delta_without_ids(tmp_path, capsys):
    from dpfed.accounting import Gaussian
    from dpfed.gaussian import mu_for_epsilon_delta
    from dpfed_apps.cli import main
    config_path, coordinator, _ = write_site(tmp_path, data_text=joint_csv_of(range(30)),
                                             policy=DELTA_POLICY)
    node = SiteNode(load_config(config_path))
    node.handle_round(coordinator.sign(gaussian_joint_spec("g1")))
    (tmp_path / "data/site.csv").write_text(joint_csv_of(range(50)))
    node.handle_round(coordinator.sign(gaussian_joint_spec("g2")))
    hashes = set(node.ledger.all_patient_histories())
    node.ledger.close()
    capsys.readouterr()
    assert main(["site", "ledger", "--config", str(config_path), "--json"]) == 0
    out = capsys.readouterr().out
    patients = json.loads(out)["patients"]
    mu = mu_for_epsilon_delta(1.0, 1e-6)
    two = compose([Gaussian(mu)] * 2).epsilon(1e-5)
    one = compose([Gaussian(mu)]).epsilon(1e-5)
    assert patients["patients"] == 50 and patients["budget_delta"] == 1e-5
    assert patients["max_spent_epsilon"] == pytest.approx(two)
    # 30 patients with two releases, 20 with one, binned by what is left of eps 3
    counts = {b["remaining_to"]: b["patients"] for b in patients["histogram"]}
    assert sum(counts.values()) == 50
    want = {}
    for left, k in ((3.0 - two, 30), (3.0 - one, 20)):
        edge = min(e for e in counts if e >= left - 1e-12 and e > 0)
        want[edge] = want.get(edge, 0) + k
    assert {e: c for e, c in counts.items() if c} == want
    assert main(["site", "ledger", "--config", str(config_path)]) == 0
    text = capsys.readouterr().out
    assert "delta 1e-05" in text and "50 patient(s)" in text
    assert not any(h in out or h in text for h in hashes) and "P000" not in out + text


def test_the_sql_renyi_filter_is_the_rule_on_each_history(tmp_path):
    """The ledger sums each patient's Renyi divergence in SQL (``_renyi_spent``); it decides
    as PatientBudget.admits on the replayed histories, for a mix of PureDP, Gaussian and
    site-wide ('all') debits."""
    from dpfed.accounting import Gaussian, ZCDP
    ledger = PrivacyLedger(tmp_path / "l.sqlite", site_id="s", total_epsilon=50.0,
                           patient_epsilon=3.0, patient_delta=1e-5)
    budget = ledger.patient_budget()
    env = pb.SignedEnvelope(payload=b"x", payload_type="dpfed.v1.Contribution")
    ledger.acknowledge_reset(aggregator_spent=0.2, operator="t")      # 0.2 to every patient
    patients = [f"p{i}" for i in range(12)]
    for k, (event, who) in enumerate([(Gaussian(0.3), patients), (PureDP(0.3), patients[::2]),
                                      (Gaussian(0.35), patients[::3]), (ZCDP(0.01), patients[1:4])]):
        ledger.record_release(round_id=f"r{k}", spec_digest=f"{k}" * 64, epsilon=1.0, n=1,
                              envelope=env, patients=who, event=event, patient_budget=budget)
    histories = ledger.patient_histories(patients + ["new"])
    assert histories["new"] == [PureDP(0.2)] and len(set(map(tuple, histories.values()))) > 3
    for event in (Gaussian(0.2), Gaussian(0.45), PureDP(0.8), PureDP(1.6)):
        got = ledger.admitted(list(histories), event, budget)
        assert got == [budget.admits(h, event) for h in histories.values()]
    assert any(ledger.admitted(list(histories), Gaussian(0.45), budget)) and \
        not all(ledger.admitted(list(histories), Gaussian(0.45), budget))
