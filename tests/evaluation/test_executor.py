"""dpfed_apps.evaluation.executor: serial, local process pool and Dask give every result exactly
once."""

import pytest

from dpfed_apps.evaluation.executor import (DaskExecutor, LocalExecutor, SerialExecutor,
                                            make_executor)


def square(x):  # top level: picklable for the process pool and Dask
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError("three")
    return x


def test_serial():
    with SerialExecutor() as ex:
        assert list(ex.map_unordered(square, range(5))) == [0, 1, 4, 9, 16]


@pytest.mark.slow  # starts two spawned worker processes that load the ADVI kernel
def test_local_pool_returns_every_result_once_with_bounded_submission():
    with LocalExecutor(2) as ex:
        assert sorted(ex.map_unordered(square, range(20))) == [x * x for x in range(20)]


@pytest.mark.slow
def test_local_pool_propagates_a_task_error():
    with LocalExecutor(2) as ex:
        with pytest.raises(ValueError, match="three"):
            list(ex.map_unordered(fail_on_three, range(6)))


@pytest.mark.slow  # a dask.distributed LocalCluster (threads) on this machine
def test_dask_local_cluster():
    pytest.importorskip("dask.distributed")
    with DaskExecutor(2, processes=False) as ex:
        assert sorted(ex.map_unordered(square, range(10))) == [x * x for x in range(10)]


@pytest.mark.slow
def test_dask_runs_a_real_evaluation_task(tmp_path):
    pytest.importorskip("dask.distributed")
    from dpfed_apps.evaluation.protocol import ProtocolConfig, bounds_table
    from dpfed_apps.evaluation.runner import plan_tasks, run_grid

    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(2.0,), sites=(1,), repeats=1)
    tasks = plan_tasks([1047], cfg, ("robust_private",), bounds_table(cfg, 10, cache_dir=tmp_path))
    with DaskExecutor(1, processes=False) as ex:
        rows = run_grid(tasks, ex)
    assert {r["n_private"] for r in rows} == {0, 100}


def test_make_executor():
    assert isinstance(make_executor("serial"), SerialExecutor)
    assert make_executor("local", 3).workers == 3
    with pytest.raises(ValueError):
        make_executor("cloud")
    with pytest.raises(RuntimeError):
        next(LocalExecutor(1).map_unordered(square, [1]))
