"""dpfed_apps.evaluation.checkpoint and ``dpfed evaluate --resume``: a stopped run keeps its
finished tasks."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dpfed_apps.evaluation.checkpoint import JournalMismatch, TaskJournal, fingerprint
from dpfed_apps.evaluation.executor import SerialExecutor
from dpfed_apps.evaluation.protocol import ProtocolConfig
from dpfed_apps.evaluation.runner import plan_tasks, run_grid

ROW = {"drug": 1047, "repeat": 0, "method": "nonprivate", "spearman": float("nan")}


def _description(repeats=2):
    cfg = ProtocolConfig(sizes=(0, 100), epsilons=(2.0,), sites=(1,), repeats=repeats)
    tasks = plan_tasks([1047], cfg, ("nonprivate",), {}, repeats_per_task=1)
    return cfg, tasks, fingerprint(cfg, ("nonprivate",), tasks)


def test_journal_round_trip_and_torn_last_line(tmp_path):
    _, _, desc = _description()
    with TaskJournal(tmp_path, desc).open(resume=False) as journal:
        journal.record(1047, (0,), [ROW])
        journal.record(1047, (1,), [dict(ROW, repeat=1)])
    path = tmp_path / "tasks.jsonl"
    # A crash while the third line was written: the torn line is dropped, its task reruns.
    with open(path, "a") as fh:
        fh.write('{"task": [1047, [2]], "rows": [{"dr')
    back = TaskJournal(tmp_path, desc).open(resume=True)
    back.close()
    assert set(back.done) == {(1047, (0,)), (1047, (1,))}
    assert back.done[(1047, (1,))][0]["repeat"] == 1
    assert back.done[(1047, (0,))][0]["spearman"] != back.done[(1047, (0,))][0]["spearman"]
    assert path.read_text().endswith("]}\n")  # truncated to the last whole line


def test_journal_refuses_another_run_and_damage(tmp_path):
    _, _, desc = _description()
    with TaskJournal(tmp_path, desc).open(resume=False) as journal:
        journal.record(1047, (0,), [ROW])
    _, _, other = _description(repeats=3)
    with pytest.raises(JournalMismatch, match="other settings"):
        TaskJournal(tmp_path, other).open(resume=True)
    path = tmp_path / "tasks.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "not json", lines[1]]) + "\n")
    with pytest.raises(JournalMismatch, match="line 2 is damaged"):
        TaskJournal(tmp_path, desc).open(resume=True)
    # Without --resume a new journal replaces the old one.
    fresh = TaskJournal(tmp_path, other).open(resume=False)
    fresh.close()
    assert fresh.done == {} and len(path.read_text().splitlines()) == 1


def test_run_grid_runs_only_what_the_journal_lacks(tmp_path, monkeypatch):
    cfg, tasks, desc = _description()
    with TaskJournal(tmp_path, desc).open(resume=False) as journal:
        first = run_grid(tasks[:1], SerialExecutor(), journal=journal)
    ran = []
    import dpfed_apps.evaluation.runner as runner

    real = runner.run_task
    monkeypatch.setattr(runner, "run_task", lambda t: ran.append(t.repeats) or real(t))
    seen = []
    with TaskJournal(tmp_path, desc).open(resume=True) as journal:
        rows = run_grid(tasks, SerialExecutor(), lambda d, t, r: seen.append((d, t)),
                        journal=journal)
    assert ran == [(1,)]                       # repeat 0 was read back, not run again
    assert seen == [(2, 2)]
    assert rows[:len(first)] == first or json.dumps(rows[:len(first)]) == json.dumps(first)
    assert sorted({r["repeat"] for r in rows}) == [0, 1]
    assert len(TaskJournal(tmp_path, desc).open(resume=True).done) == 2


@pytest.mark.slow
def test_evaluate_resumes_after_sigint(tmp_path):
    """A real run stopped with Ctrl-C keeps its finished tasks; --resume completes the table
    and runs only the missing tasks."""
    out = tmp_path / "res"
    args = [sys.executable, "-m", "dpfed_apps.cli", "evaluate", "--drug", "1047", "--drug",
            "1373", "--repeats", "8", "--repeats-per-task", "1", "--sizes", "0,100,200,300",
            "--sites", "1,3", "--epsilons", "1,2", "--methods", "robust_private,nonprivate",
            "--workers", "1", "--out", str(out), "--json"]
    # A suite started as a background job (`python -m pytest &`) runs with SIGINT ignored,
    # and an ignored signal stays ignored across exec: give the child Ctrl-C's default
    # disposition, as a terminal would, so the test does not depend on how it was started.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    journal = out / "tasks.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if journal.exists() and len(journal.read_text().splitlines()) >= 3:  # 2 tasks done
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    kept = len(journal.read_text().splitlines()) - 1
    assert 2 <= kept < 16 and not (out / "results.csv").exists()

    done = subprocess.run(args + ["--resume"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"({kept} already done" in done.stderr
    result = json.loads(done.stdout)
    assert result["errors"] == 0
    cells = {(r["method"], r["n_private"]): r for r in result["results"]}
    assert cells[("robust_private", 100)]["repeats"] == 8
    assert cells[("robust_private", 100)]["drugs"] == 2
    assert len(journal.read_text().splitlines()) == 1 + 16
