"""aggregator.exact_sum: the running sum is the correctly rounded exact sum (checked against
math.fsum and exact rational arithmetic), whatever the order, the batching or the range of
the values; and the round's running total equals the sum of its stored encodings."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.aggregate import RunningTotal, exact_sum, exact_sum_encoded
from aggregator.exact_sum import ExactSum, ExactSumError
from dpfed.statistics import Statistics, StatisticsError

from tests.conftest import public_statistics, random_statistics

finite = st.floats(allow_nan=False, allow_infinity=False)
# Same magnitudes with cancellation, subnormals, signed zeros and the extremes of the range.
special = st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e308,
                           -1e308, 1.7976931348623157e308, 1.0, -1.0, 2.0**53, 0.1])


def _bits(a) -> list[int]:
    return np.asarray(a, dtype=np.float64).view(np.int64).tolist()


def _exact(column) -> float:
    """Reference: exact rational sum, rounded once (Fraction -> float is correctly rounded)."""
    return float(sum((Fraction(x) for x in column), Fraction(0)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(finite | special, min_size=3, max_size=3), min_size=1, max_size=40))
def test_running_sum_is_the_correctly_rounded_exact_sum(rows):
    rows = np.array(rows, dtype=np.float64)
    one_by_one, batched = ExactSum(3), ExactSum(3)
    for r in rows:
        one_by_one.add(r)
    batched.add_rows(rows)
    try:
        expected = [_exact(rows[:, j].tolist()) for j in range(3)]
    except OverflowError:
        for s in (one_by_one, batched):
            with pytest.raises(ExactSumError):
                s.result()
        return
    got = one_by_one.result()
    assert _bits(got) == _bits(expected) and _bits(batched.result()) == _bits(expected)
    for j in range(3):
        try:
            fsum = math.fsum(rows[:, j].tolist())
        except OverflowError:   # fsum gives up on an intermediate overflow; we do not
            continue
        # Bit-identical to fsum (up to the sign of a zero sum: 0.0 == -0.0 in Statistics).
        assert got[j] == fsum and _bits([got[j] + 0.0]) == _bits([fsum + 0.0])


def test_result_does_not_depend_on_order_or_batching():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(200, 7)) * 10.0 ** rng.integers(-20, 20, size=(200, 7))
    rows[50] = -rows[10]                      # exact cancellations
    reference = ExactSum(7)
    reference.add_rows(rows)
    expected = _bits(reference.result())
    for seed in range(3):
        order = list(range(200))
        random.Random(seed).shuffle(order)
        s = ExactSum(7)
        for i in order[:77]:
            s.add(rows[i])
        s.add_rows(rows[order[77:]])
        assert _bits(s.result()) == expected
    merged, other = ExactSum(7), ExactSum(7)
    merged.add_rows(rows[:100])
    other.add_rows(rows[100:])
    merged.merge(other)
    assert _bits(merged.result()) == expected and merged.count == 200


def test_carries_are_propagated_before_limbs_can_overflow(monkeypatch):
    import aggregator.exact_sum as es
    monkeypatch.setattr(es, "_NORMALISE_EVERY", 4)   # exercise normalisation on a few rows
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(50, 5)) * 1e300
    s = ExactSum(5)
    for r in rows[:25]:
        s.add(r)
    s.add_rows(rows[25:])
    assert _bits(s.result()) == _bits([_exact(rows[:, j].tolist()) for j in range(5)])


def test_a_copy_is_independent():
    s = ExactSum(2)
    s.add([1.0, 2.0])
    twin = s.copy()
    twin.add([1.0, 1.0])
    assert s.result().tolist() == [1.0, 2.0] and twin.result().tolist() == [2.0, 3.0]


@pytest.mark.parametrize("bad", [[np.nan, 1.0], [1.0, np.inf]])
def test_non_finite_values_are_refused(bad):
    with pytest.raises(ExactSumError):
        ExactSum(2).add(bad)
    with pytest.raises(ExactSumError):
        ExactSum(2).add_rows([bad])


def test_wrong_shapes_are_refused():
    with pytest.raises(ValueError):
        ExactSum(3).add([1.0, 2.0])
    with pytest.raises(ValueError):
        ExactSum(3).add_rows([1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        ExactSum(0)


def test_an_overflowing_total_is_a_clear_error():
    s = ExactSum(1)
    s.add([1.7e308])
    s.add([1.7e308])
    with pytest.raises(ExactSumError, match="outside the float64 range"):
        s.result()
    s.add([-1.7e308])                          # back in range: no intermediate overflow
    assert s.result().tolist() == [1.7e308]


def test_running_total_equals_the_sum_at_close():
    parts = [random_statistics(d=4, seed=i, n=10 + i) for i in range(150)]  # > 2 blocks
    running = RunningTotal(4)
    for i, p in enumerate(parts):
        running.add_encoded(p.to_bytes())
        if i == 70:
            snapshot = running.copy()
    total = running.total()
    assert total == exact_sum(parts) == exact_sum_encoded([p.to_bytes() for p in parts])
    assert total.n == sum(p.n for p in parts) and running.count == 150
    assert snapshot.total() == exact_sum(parts[:71]) and snapshot.count == 71
    assert np.array_equal(total.xtx, total.xtx.T)
    for j in range(4):
        assert total.xty[j] == math.fsum(p.xty[j] for p in parts)
    with pytest.raises(StatisticsError, match="dimension"):
        running.add_encoded(random_statistics(d=3).to_bytes())
    nan = random_statistics(d=4).to_bytes()[:-8] + np.array([np.nan]).astype("<f8").tobytes()
    with pytest.raises(StatisticsError, match="NaN"):
        running.add_encoded(nan)
    assert running.total() == total


def test_running_total_folds_outside_callers_lock_and_loses_nothing():
    """Threads queue releases and fold blocks concurrently (as the round manager's gRPC
    threads do); a fold finding another in progress leaves its rows for later; ``copy`` and
    ``total`` see everything queued before them."""
    import threading
    parts = [random_statistics(d=3, seed=i, n=1 + i) for i in range(200)]
    running = RunningTotal(3)
    running._folding.acquire()              # a fold in progress elsewhere
    for p in parts[:40]:
        running.add_encoded(p.to_bytes())   # never waits for it
    running.fold()                          # does not wait either: skipped
    assert running._values.count == 0 and len(running._pending) == 40
    running._folding.release()
    running.fold()
    assert running._values.count == 40 and running._pending == []

    def contribute(chunk):
        for p in chunk:
            running.add_encoded(p.to_bytes())
            running.fold()

    threads = [threading.Thread(target=contribute, args=(parts[40 + k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert running.copy().total() == running.total() == exact_sum(parts)
    assert running.count == 200 and running.total().n == sum(p.n for p in parts)


def test_statistics_upper_values_round_trip_keeps_every_bit():
    s = Statistics(np.array([[-0.0, 1.5], [1.5, 5e-324]]), np.array([-0.0, 2.0]), -0.0, 3)
    again = Statistics.from_upper(2, 3, s.upper_values())
    assert _bits(again.xtx.ravel()) == _bits(s.xtx.ravel())
    assert _bits(again.xty) == _bits(s.xty) and _bits([again.yty]) == _bits([s.yty])
    with pytest.raises(StatisticsError):
        Statistics.from_upper(2, 3, np.zeros(5))


def _two_of_three_accepted(federation):
    """A round of quorum 3 with public statistics, two of its three releases accepted."""
    public = public_statistics(seed=9, n=10)
    federation.start_round(federation.spec(quorum=3, public=public))
    releases = {s: random_statistics(seed=i, n=40 + i) for i, s in enumerate(federation.SITES)}
    for site in federation.SITES[:2]:
        assert federation.stub.Contribute(federation.contribution(site, "r1", releases[site])).accepted
    return public, releases


def _restart_and_finish(federation, public, releases):
    """Start the (stopped) aggregator: its total is the exact sum of the two accepted releases
    and the public data; the third release completes the round with the exact sum of all."""
    from dpfed.v1 import dpfed_pb2 as pb
    federation.start()
    assert federation.manager.aggregated_statistics("r1") == exact_sum(
        [releases[s] for s in federation.SITES[:2]] + [public])
    last = federation.SITES[2]
    assert federation.stub.Contribute(federation.contribution(last, "r1", releases[last])).accepted
    assert federation.coordinator.wait("r1", 60, poll_s=0.05).state == pb.RoundStatus.DONE
    assert federation.manager.aggregated_statistics("r1") == exact_sum([*releases.values(), public])


def test_running_total_survives_a_restart(federation):
    """Two releases before a restart, one after: the total the model is fitted on (rebuilt
    from the store, then updated) equals the exact sum of all three plus the public data."""
    public, releases = _two_of_three_accepted(federation)
    federation.stop()
    _restart_and_finish(federation, public, releases)
    expected = [*releases.values(), public]
    for j in range(3):
        assert federation.manager.aggregated_statistics("r1").xty[j] == _exact(
            [p.xty[j] for p in expected])


def _adversarial_rows(rng, rows: int) -> np.ndarray:
    """Columns in the regimes the folds treat differently: ordinary magnitudes (two folds),
    a wide mix of exponents (three folds, then the limbs), subnormals only, a top-of-range
    column (the whole block through the limbs), exact cancellations, zeros of both signs,
    2**53-apart values whose low bits only an exact sum keeps, and same-sign values near
    their column's largest."""
    cols = [
        rng.normal(size=rows) * 1e3,
        rng.normal(size=rows) * 10.0 ** rng.integers(-300, 300, size=rows),
        rng.integers(-2**52, 2**52, size=rows) * 5e-324,
        rng.normal(size=rows) * 2e306,
        np.where(np.arange(rows) % 2 == 0, 1.0, -1.0) * np.repeat(rng.normal(size=rows // 2 + 1), 2)[:rows],
        np.where(rng.random(rows) < 0.5, 0.0, -0.0),
        np.where(rng.random(rows) < 0.5, 2.0**53, 1.0) * rng.choice([-1.0, 1.0], size=rows),
        rng.normal(size=rows) * np.where(rng.random(rows) < 0.1, 1e-30, 1.0),
        rng.uniform(0.5, 1.0, size=rows),    # one sign, all near the top: the headroom's worst case
    ]
    return np.stack(cols, axis=1)


def test_fold_block_splits_a_block_into_exact_sums():
    """The folds lose and invent nothing: in exact rational arithmetic, the column sums of a
    block equal the folds' sums plus what is left for the limbs; each branch is exercised."""
    from aggregator.exact_sum import _ROWS_PER_BLOCK, _fold_block
    rng = np.random.default_rng(21)
    seen = set()
    for rows in (1, 2, 17, _ROWS_PER_BLOCK):
        block = _adversarial_rows(rng, rows)
        for columns in ([0], [0, 4, 5, 6], [0, 1, 2], [2], [3, 0], [8], list(range(9))):
            part = np.ascontiguousarray(block[:, columns])
            sums, rest = _fold_block(part)
            seen.add((len(sums), rest is None))
            for j in range(part.shape[1]):
                exact = sum((Fraction(float(x)) for x in part[:, j]), Fraction(0))
                folded = sum((Fraction(float(s[j])) for s in sums), Fraction(0))
                left = Fraction(0) if rest is None else sum(
                    (Fraction(float(x)) for x in rest[:, j]), Fraction(0))
                assert folded + left == exact
    # two folds and done; three folds and a remainder; the whole block to the limbs
    assert {(2, True), (3, False), (0, False)} <= seen


def test_adversarial_rows_sum_like_fsum_in_any_order_and_blocking():
    """Many blocks of adversarial columns: bit for bit math.fsum (and the exact rational
    sum), whatever the row order, the split into add_rows calls, or adding one row at a time
    (the limbs alone)."""
    rng = np.random.default_rng(22)
    rows = _adversarial_rows(rng, 300)
    rows[250:] = -rows[:50]                      # cancellations across blocks
    expected = [_exact(rows[:, j].tolist()) for j in range(rows.shape[1])]
    for j in range(rows.shape[1]):
        assert expected[j] == math.fsum(rows[:, j].tolist())
    one_by_one = ExactSum(rows.shape[1])
    for r in rows:
        one_by_one.add(r)
    assert _bits(one_by_one.result()) == _bits(expected)
    for seed in range(4):
        order = np.random.default_rng(seed).permutation(len(rows))
        cuts = sorted(np.random.default_rng(seed + 100).choice(np.arange(1, 300), 5, replace=False))
        s = ExactSum(rows.shape[1])
        for part in np.split(rows[order], cuts):
            s.add_rows(part)
        assert _bits(s.result()) == _bits(expected) and s.count == 300


def test_running_total_survives_a_crash_mid_round(federation):
    """A power cut after two of three releases were acknowledged: the store as it was then
    (the database and its write-ahead log copied while the aggregator runs, nothing closed)
    holds each release once, inside its envelope, and a restart on it rebuilds the exact sum
    from the envelopes; the round then completes with the exact sum of all three."""
    import shutil
    import sqlite3
    public, releases = _two_of_three_accepted(federation)
    db = federation.tmp / "agg.sqlite"
    snapshot = federation.tmp / "snapshot"
    snapshot.mkdir()
    for suffix in ("", "-wal"):
        shutil.copy(f"{db}{suffix}", snapshot / f"agg.sqlite{suffix}")
    federation.stop()
    for suffix in ("", "-wal", "-shm"):
        if (federation.tmp / f"agg.sqlite{suffix}").exists():
            (federation.tmp / f"agg.sqlite{suffix}").unlink()
    for suffix in ("", "-wal"):
        shutil.copy(snapshot / f"agg.sqlite{suffix}", f"{db}{suffix}")
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT site_id, statistics FROM contributions ORDER BY site_id").fetchall() \
        == [(s, b"") for s in sorted(federation.SITES[:2])]
    raw.close()
    _restart_and_finish(federation, public, releases)
