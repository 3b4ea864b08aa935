"""max_site_rows sizes the fixed-point grid only: a federation with more rows than the grid
holds cannot make a site refuse (its exact statistics are encoded modulo 2^64), so the
aggregator fails closed after unmasking instead (``SecureRound.decode_sum``,
``GridCalibration.check_sum``): a sum whose noisy n is beyond the grid's row capacity, or
whose entries are beyond their bounds given n, is refused with a message that tells the
coordinator to raise max_site_rows."""

from __future__ import annotations

import numpy as np
import pytest

from dpfed import secure_round
from dpfed.secagg import exact
from dpfed.secagg import fixedpoint as fp
from dpfed.secagg.errors import SecAggError, SumOutOfRange
from dpfed.v1 import dpfed_pb2 as pb
from tests.test_free_answers import SITES, spec


def extreme_rows(d: int, n: int, x: float, y: float, qx: int, qy: int
                 ) -> exact.ExactStatistics:
    """The exact statistics of n copies of the row (x, ..., x; y), without n rows in memory
    (what a site with that many rows at the bound encodes)."""
    xq = int(exact.quantize(np.array([x]), qx)[0])
    yq = int(exact.quantize(np.array([y]), qy)[0])
    m = d * (d + 1) // 2
    return exact.ExactStatistics(d, n, qx, qy, (n * xq * xq,) * m, (n * xq * yq,) * d,
                                 n * yq * yq)


def _round(**fields):
    s = spec("r-overflow", **fields)
    secure = secure_round.build(s, SITES)
    qx, qy = exact.quantum_exponents(s.x_bound, s.y_bound, 1.0)
    return s, secure, qx, qy


def _sum(secure, site_stats, noise=True):
    cal = secure.calibration
    inputs = [cal.release_exact(st) if noise else cal.encode_exact(st) for st in site_stats]
    return fp.wrap_sum(inputs)


def test_capacity_is_a_large_multiple_of_the_sites_times_max_site_rows():
    s, secure, _, _ = _round()
    cal = secure.calibration
    cap = cal.row_capacity()
    assert cap >= len(SITES) * s.max_site_rows
    assert cal.headroom() == pytest.approx(cap / (len(SITES) * s.max_site_rows))
    assert cal.headroom() > 1e6          # the smallest scale that meets the rounding ratio
    # the condition choose_scale checks holds for cap rows in every part, and a hundredth
    # more rows overflows the part that binds
    for part in ("xtx", "xty", "yty"):
        assert (cal.scales[part] * cap * cal.row_bounds[part] + len(SITES) / 2
                + fp.TAIL_SCALES * 2 * cal.grid_noise[part]) < 2 ** 63
    assert max(cal.scales[p] * cap * 1.01 * cal.row_bounds[p]
               for p in ("xtx", "xty", "yty")) >= 2 ** 63


def test_an_honest_sum_below_capacity_decodes_and_passes():
    s, secure, qx, qy = _round()
    cap = secure.calibration.row_capacity()
    each = (cap - 10 ** 6) // len(SITES)
    stats = [extreme_rows(3, each, 0.5, 2.0, qx, qy) for _ in SITES]
    upper, n = secure.decode_sum(_sum(secure, stats))
    assert abs(n - each * len(SITES)) < 1000
    truth = sum(st.upper_values() for st in stats)
    assert np.allclose(upper, truth, rtol=1e-9)                 # no wrap


def test_a_sum_that_wraps_is_refused_with_the_message():
    """Four sites of 0.3 x capacity rows at the bound each: every Sxy entry of the sum is
    beyond 2^63 on the grid and wraps; the decoded n (which never wraps) is beyond the
    capacity, and the sum is refused, telling the coordinator to raise max_site_rows."""
    s, secure, qx, qy = _round()
    cal = secure.calibration
    each = int(0.3 * cal.row_capacity())
    stats = [extreme_rows(3, each, 0.5, 2.0, qx, qy) for _ in SITES]
    vector = _sum(secure, stats)
    upper, n = cal.decode(vector)
    truth = sum(st.upper_values() for st in stats)
    assert not np.allclose(upper, truth, rtol=1e-3)             # it did wrap
    with pytest.raises(SumOutOfRange, match="raise max_site_rows to at least") as info:
        secure.decode_sum(vector)
    assert isinstance(info.value, SecAggError)
    assert f"{cal.row_capacity()} rows in all" in str(info.value)


def test_a_corrupt_entry_or_a_negative_n_is_refused():
    s, secure, qx, qy = _round()
    cal = secure.calibration
    stats = [extreme_rows(3, 100, 0.5, 2.0, qx, qy) for _ in SITES]
    vector = _sum(secure, stats, noise=False)
    secure.decode_sum(vector)                                    # fine as it is
    bent = vector.copy()
    bent[0] += np.uint64(2 ** 62)                                # one Sxx entry off by 2^62
    with pytest.raises(SumOutOfRange, match="entry of xtx"):
        secure.decode_sum(bent)
    negative = vector.copy()
    negative[-1] = np.uint64(2 ** 64 - 10 ** 6)                  # n = -10^6
    with pytest.raises(SumOutOfRange, match="raise max_site_rows"):
        secure.decode_sum(negative)


def test_the_aggregator_fails_a_round_whose_sum_outgrew_the_grid(tmp_path, monkeypatch):
    """A real secure round over gRPC whose three sites hold 0.45 x capacity rows each (all
    at the bound; monkeypatched statistics, not rows in memory): every site consents and
    releases (none refuses for its rows), the sum wraps, and the aggregator fails the round
    after unmasking with SumOutOfRange's message instead of fitting a wrong sum."""
    import site_node.secure as site_secure
    from tests.secure_federation import SecureFed, wait_state

    fed = SecureFed(tmp_path, 3)
    spec_ = fed.spec(t=2, quorum=3, rows=125)
    probe = secure_round.build(spec_, fed.sites).calibration
    each = int(0.45 * probe.row_capacity())
    qx, qy = exact.quantum_exponents(spec_.x_bound, spec_.y_bound, 1.0)
    monkeypatch.setattr(site_secure, "exact_clipped_statistics",
                        lambda x, y, bx, by, r: extreme_rows(3, each, 0.5, 2.0, qx, qy))
    fed.start_aggregator()
    try:
        fed.start_clients()
        fed.coordinator().start_round(spec_)
        status = wait_state(fed.manager, "sec-1", (pb.RoundStatus.DONE, pb.RoundStatus.FAILED),
                            timeout=40)
        assert status.state == pb.RoundStatus.FAILED, status.message
        assert list(status.refusals) == []
        assert "unmasking failed: SumOutOfRange" in status.message
        assert "raise max_site_rows to at least" in status.message
        assert fed.manager.context.rounds["sec-1"].running is None       # nothing to fit
    finally:
        fed.stop()
