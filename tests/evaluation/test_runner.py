"""dpfed_apps.evaluation.runner: one task's rows, the posterior fits, public-only rows and failing
cells."""

import math

import numpy as np
import pytest

from dpfed_apps.evaluation.executor import SerialExecutor
from dpfed_apps.evaluation.protocol import ProtocolConfig, bounds_table
from dpfed_apps.evaluation.runner import ROW_FIELDS, plan_tasks, run_grid, run_task


@pytest.fixture(scope="module")
def cfg_and_bounds(tmp_path_factory):
    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(2.0,), sites=(1, 3), repeats=2)
    return cfg, bounds_table(cfg, 10, cache_dir=tmp_path_factory.mktemp("bounds"))


def test_task_rows_cover_the_grid(cfg_and_bounds):
    cfg, bounds = cfg_and_bounds
    methods = ("robust_private", "nonprivate", "adassp")
    (task,) = plan_tasks([1047], cfg, methods, bounds, repeats_per_task=2)
    result = run_task(task)
    keys = {(r["method"], r["epsilon"], r["n_private"], r["sites"], r["aggregation"],
             r["repeat"]) for r in result.rows}
    expected = set()
    for rep in (0, 1):
        for n in (0, 100):
            # K = 1 is always independent; K = 3 once per aggregation (issue 10)
            expected |= {("robust_private", 2.0, n, 1, "independent", rep),
                         ("robust_private", 2.0, n, 3, "independent", rep),
                         ("robust_private", 2.0, n, 3, "secure", rep),
                         ("nonprivate", None, n, 1, "independent", rep),
                         ("adassp", 2.0, n, 1, "independent", rep)}
    assert keys == expected and len(result.rows) == len(expected)
    assert all(r["noise_threshold"] == (3 if r["aggregation"] == "secure" else None)
               for r in result.rows)
    assert all(set(r) == set(ROW_FIELDS) for r in result.rows)
    assert not any(r["error"] for r in result.rows)
    assert all(math.isfinite(r["spearman"]) for r in result.rows)
    # n = 0 is public only: one fit reported for every method.
    for rep in (0, 1):
        zero = {r["spearman"] for r in result.rows if r["n_private"] == 0 and r["repeat"] == rep}
        assert len(zero) == 1
    # The Gamma-prior fits (robust_private x 3 (K, aggregation), nonprivate, public-only).
    assert result.fits == 2 * (3 + 1 + 1)
    assert all(r["converged"] for r in result.rows if r["method"] != "adassp" or r["n_private"] == 0)


def test_nonprivate_recovers_the_known_tp53_signal(cfg_and_bounds):
    # Nutlin-3a (1047): TP53_mut is a strong marker (data README). A non-private model on
    # 100 private + 10 public lines must rank the test lines far better than chance.
    cfg, bounds = cfg_and_bounds
    (task,) = plan_tasks([1047], cfg, ("nonprivate",), bounds, repeats_per_task=2)
    rows = [r for r in run_task(task).rows if r["n_private"] == 100]
    assert np.mean([r["spearman"] for r in rows]) > 0.3


def test_a_failing_method_is_recorded_not_raised(cfg_and_bounds, monkeypatch):
    cfg, bounds = cfg_and_bounds
    import dpfed_apps.evaluation.methods as registry

    class Broken:
        name, private, posterior = "adassp", True, None

        def fit(self, data, setting, *, seed):
            raise RuntimeError("boom")

    real = registry.get_method
    monkeypatch.setattr(registry, "get_method",
                        lambda name, **kw: Broken() if name == "adassp" else real(name, **kw))
    (task,) = plan_tasks([1047], cfg, ("adassp",), bounds, repeats_per_task=2)
    rows = [r for r in run_task(task).rows if r["n_private"] == 100]
    assert rows and all(r["error"] == "RuntimeError: boom" and math.isnan(r["spearman"]) for r in rows)


def test_sizes_beyond_the_private_pool_are_skipped(tmp_path):
    cfg = ProtocolConfig(sizes=(0, 900), epsilons=(1.0,), sites=(1,), repeats=1)
    bounds = bounds_table(cfg, 10, cache_dir=tmp_path)
    (task,) = plan_tasks([1047], cfg, ("nonprivate",), bounds)
    assert {r["n_private"] for r in run_task(task).rows} == {0}


def test_plan_tasks_chunks_repeats():
    cfg = ProtocolConfig(repeats=7)
    tasks = plan_tasks([1, 2], cfg, ("nonprivate",), {}, repeats_per_task=3)
    assert [t.repeats for t in tasks[:3]] == [(0, 1, 2), (3, 4, 5), (6,)]
    assert len(tasks) == 6


def test_run_grid_reports_progress(cfg_and_bounds):
    cfg, bounds = cfg_and_bounds
    tasks = plan_tasks([1047], cfg, ("nonprivate",), bounds, repeats_per_task=1)
    seen = []
    rows = run_grid(tasks, SerialExecutor(), lambda d, t, r: seen.append((d, t)))
    assert seen == [(1, 2), (2, 2)] and len(rows) == 4


def test_robust_private_uses_the_public_shaped_table(cfg_and_bounds, monkeypatch, tmp_path):
    """With bounds="public" (the default) robust_private's setting for every (n, K, eps) is
    the repeat's table entry (bounds x public sigmas, split, row-norm bound); the other
    methods keep the Gaussian table."""
    from dpfed_apps.evaluation.methods.robust_private import RobustPrivate
    from dpfed_apps.evaluation.protocol import load_problem, prepare_repeat, repeat_bounds

    cfg, bounds = cfg_and_bounds
    seen = []
    real = RobustPrivate.fit

    def spy(self, data, setting, *, seed):
        seen.append(setting)
        return real(self, data, setting, seed=seed)

    monkeypatch.setattr(RobustPrivate, "fit", spy)
    task = plan_tasks([1047], cfg, ("robust_private",), bounds, repeats_per_task=1,
                      cache_dir=tmp_path)[0]   # repeat 0
    run_task(task)
    data = prepare_repeat(load_problem(1047, cfg), cfg, 1047, 0)
    table = repeat_bounds(data, cfg)
    # n = 100: K = 1, and K = 3 independent and secure (one draw: the (n, 1) cell)
    assert sorted((s.n_sites, s.aggregation) for s in seen) == \
        [(1, "independent"), (3, "independent"), (3, "secure")]
    for setting in seen:
        draws = 1 if setting.aggregation == "secure" else setting.n_sites
        choice = table[(100, draws, 2.0)]
        assert setting.x_bound == pytest.approx(choice.omega_x * data.sigma_x)
        assert setting.y_bound == pytest.approx(choice.omega_y * data.sigma_y)
        assert setting.budget_split == choice.budget_split and setting.x_norm_bound == 1.0
    assert list(tmp_path.glob("table-*.json"))
