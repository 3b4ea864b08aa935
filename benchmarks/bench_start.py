"""How long `dpfed simulate` takes, whole and phase by phase (issue 21 item 5).

    python benchmarks/bench_start.py [--runs 3] [--fresh] [--source DIR ...] [--json]
        [-- extra simulate arguments]

Runs ``python -m dpfed_apps.cli simulate --json --workdir W`` (the README's first command,
its defaults) ``--runs`` times and reports each run's wall time, the CPU time of the whole
process tree (user + sys of the command and every process it started, waited for), the
1-minute load average before it, and where the wall time went. Phases come from the times
the command prints its progress lines (stamped here as they arrive) and from the processes'
own logs in W/logs (aggregator listening, sites subscribed, round started and done, SIGTERM,
stopped), on one clock. The command starts the processes first and works beside them, so
three phases run beside the others (in brackets):

  interpreter     start -> "starting aggregator": Python, imports (the processes start here)
  (data)          "starting aggregator" -> the data set's line (CA and kits, data read)
  (aggregator_up) "starting aggregator" -> the aggregator's "listening" log line
  ready           "starting aggregator" -> "aggregator ready" (the sites' files written and the
                  aggregator healthy; the sites are told to dial)
  (plan)          "aggregator ready" -> "forecast gain" (bounds and forecast, while sites dial)
  sites_up        -> the last "site ... subscribed" (sites dial and subscribe)
  to_round        -> the aggregator's "started by coordinator" (readiness polling, spec)
  round           -> "closed after" (consent, keys, release, unmask); round_s from the result
  fit             -> "DONE" (the aggregator's fit); fit_s from the result
  to_stop         -> "received SIGTERM" (the result fetched, the polling interval)
  stop_exit       -> the command's exit (the baselines and scores, fitted while the children
                  stop; every child waited for; the report)

The phases not in brackets add up to the wall time. PYTHONDONTWRITEBYTECODE is removed from
the command's environment (set in a harness, it would make every run compile every module).
``--fresh`` gives every run an empty NUMBA_CACHE_DIR (a fresh machine, the packages installed:
pip byte-compiles them, nothing has compiled the fit): the aggregator and the command then
compile the fit's Numba code (docs/benchmarks.md says how much of the time that is);
``--no-bytecode`` also an empty PYTHONPYCACHEPREFIX (every module compiled to bytecode again,
as from a source checkout never run).
``--source DIR`` (repeatable) runs the command from another checkout (PYTHONPATH=DIR, cwd
DIR); with two or more, runs alternate between them (interleaved, same load).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PHASES = ("interpreter", "data", "aggregator_up", "ready", "plan", "sites_up", "to_round",
          "round", "fit", "to_stop", "stop_exit")
#: Phases that run beside the chain of the others (they do not add up to the wall time).
BESIDE = ("data", "aggregator_up", "plan")

# (mark, where, pattern); "progress" = a line the command prints on stderr.
MARKS = (
    ("launch", "progress", r"\[simulate\] starting aggregator"),
    ("data", "progress", r"\[simulate\] .*: \d+ lines, d="),
    ("forecast", "progress", r"\[simulate\] forecast gain"),
    ("listening", "aggregator", r"aggregator listening on port"),
    ("ready", "progress", r"\[simulate\] aggregator ready"),
    ("subscribed", "aggregator", r"site \S+ subscribed"),     # the last one
    ("started", "aggregator", r"started by coordinator"),
    ("closed", "aggregator", r": closed after "),
    ("done", "aggregator", r": DONE"),
    ("sigterm", "aggregator", r"received SIGTERM"),
)
# phase: (from mark, to mark); "start" and "exit" are the command's.
SPANS = {"interpreter": ("start", "launch"), "data": ("launch", "data"),
         "aggregator_up": ("launch", "listening"), "ready": ("launch", "ready"),
         "plan": ("ready", "forecast"),
         "sites_up": ("ready", "subscribed"), "to_round": ("subscribed", "started"),
         "round": ("started", "closed"), "fit": ("closed", "done"), "to_stop": ("done", "sigterm"),
         "stop_exit": ("sigterm", "exit")}

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def log_times(path: Path, pattern: str, last: bool = False) -> float | None:
    """The wall-clock time (epoch seconds) of the first (or last) line matching ``pattern``."""
    found = None
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        m = LOG_TIME.match(line)
        if m and re.search(pattern, line):
            found = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if not last:
                break
    return found


def one_run(source: Path, extra: list[str], fresh: bool, no_bytecode: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(source), env.get("PYTHONPATH")) if p)
    if fresh:
        env["NUMBA_CACHE_DIR"] = str(work / "numba-cache")
    if no_bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    command = [sys.executable, "-m", "dpfed_apps.cli", "simulate", "--json", "--workdir",
               str(work / "sim"), *extra]
    load_before = load()
    cpu0 = children_cpu()
    t0_wall = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=source, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    progress: list[tuple[float, str]] = []

    def read_stderr():
        for line in proc.stderr:
            progress.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    out = proc.stdout.read()
    proc.wait()
    wall = time.monotonic() - t0
    end_wall = t0_wall + wall
    reader.join(5)
    cpu = children_cpu() - cpu0
    if proc.returncode != 0:
        tail = "\n".join(line for _, line in progress[-30:])
        raise SystemExit(f"simulate failed (exit {proc.returncode}); work folder {work}\n{tail}")
    result = json.loads(out)
    logs = work / "sim" / "logs"
    marks = {"start": t0_wall, "exit": end_wall}
    for mark, where, pattern in MARKS:
        if where == "progress":
            marks[mark] = next((t for t, line in progress if re.search(pattern, line)), None)
        else:
            marks[mark] = log_times(logs / f"{where}.log", pattern, last=mark == "subscribed")
    phases = {}
    for phase in PHASES:
        a, b = (marks.get(m) for m in SPANS[phase])
        phases[phase] = None if a is None or b is None else round(b - a, 3)
    shutil.rmtree(work, ignore_errors=True)
    timings = result.get("timings", {})
    return {"source": str(source), "fresh": fresh, "no_bytecode": no_bytecode, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 2), "load": load_before, "phases": phases,
            "round_s": timings.get("round_s"), "fit_s": timings.get("fit_s"),
            "baselines_s": timings.get("baselines_s")}


COMPILE_PROBE = """
import resource, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t, c = time.monotonic(), cpu()
import posterior.noise_aware_jit as jit
t1, c1 = time.monotonic(), cpu()
jit.warm_up()
print(t1 - t, c1 - c, time.monotonic() - t1, cpu() - c1)
"""


def compile_cost(source: Path) -> dict:
    """The fit's Numba code alone (posterior.noise_aware_jit.warm_up, the part the fit's
    owner measures in "Noise-aware fit"): in a fresh interpreter with an empty cache (compiled)
    and again with the cache that run wrote (loaded)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-start-numba-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join(p for p in (str(source),
                                                          os.environ.get("PYTHONPATH")) if p))
        for label in ("compile", "load"):
            line = subprocess.run([sys.executable, "-c", COMPILE_PROBE], cwd=source, env=env,
                                  capture_output=True, text=True, check=True).stdout.split()
            imp_wall, imp_cpu, wall, cpu = map(float, line)
            out[label] = {"import_wall_s": round(imp_wall, 2), "import_cpu_s": round(imp_cpu, 2),
                          "warm_up_wall_s": round(wall, 2), "warm_up_cpu_s": round(cpu, 2),
                          "load": load()}
    return out


def summarise(rows: list[dict]) -> dict:
    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None
    return {"runs": len(rows), "wall_s": med(r["wall_s"] for r in rows),
            "wall_min_s": min(r["wall_s"] for r in rows),
            "cpu_s": med(r["cpu_s"] for r in rows), "load": med(r["load"] for r in rows),
            "phases": {p: med(r["phases"][p] for r in rows) for p in PHASES},
            "round_s": med(r["round_s"] for r in rows), "fit_s": med(r["fit_s"] for r in rows),
            "baselines_s": med(r["baselines_s"] for r in rows)}


def _phase(name: str, seconds: float) -> str:
    return f"({name} {seconds:.2f})" if name in BESIDE else f"{name} {seconds:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per source (median reported)")
    ap.add_argument("--fresh", action="store_true",
                    help="an empty Numba cache for every run (fresh machine)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help="an empty bytecode cache (PYTHONPYCACHEPREFIX) for every run too")
    ap.add_argument("--source", type=Path, action="append", default=None,
                    help="checkout to run (repeatable: interleaved); default this one")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs per source first (fills the caches; not with --fresh)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("extra", nargs="*", help="arguments passed to dpfed simulate")
    args = ap.parse_args(argv)
    sources = [p.resolve() for p in (args.source or [ROOT])]
    if not (args.fresh or args.no_bytecode):
        for source in sources:
            for _ in range(args.warmup):
                one_run(source, args.extra, False)
    rows = {str(s): [] for s in sources}
    for i in range(args.runs):
        for source in sources:
            row = one_run(source, args.extra, args.fresh, args.no_bytecode)
            rows[str(source)].append(row)
            if not args.json:
                ph = "  ".join(_phase(k, v) for k, v in row["phases"].items() if v is not None)
                print(f"{source.name} run {i + 1}: {row['wall_s']:.2f} s wall, {row['cpu_s']:.1f} "
                      f"CPU-s, load {row['load']:.2f} | {ph}", flush=True)
    summary = {s: summarise(r) for s, r in rows.items()}
    numba = {str(s): compile_cost(s) for s in sources} if args.fresh else {}
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows, "numba": numba}, indent=2))
    else:
        for source, s in summary.items():
            label = " (fresh)" if args.fresh else ""
            label += " (no bytecode)" if args.no_bytecode else ""
            print(f"{Path(source).name}{label}: median {s['wall_s']:.2f} s "
                  f"wall (min {s['wall_min_s']:.2f}), {s['cpu_s']:.1f} CPU-s, load {s['load']:.2f}; "
                  f"round {s['round_s']} s, fit {s['fit_s']} s")
            print("  phases (median s): " + ", ".join(
                _phase(k, v) for k, v in s["phases"].items() if v is not None))
            for label, c in numba.get(source, {}).items():
                print(f"  fit's Numba code alone ({label}, empty cache first): import "
                      f"{c['import_wall_s']:.2f} s ({c['import_cpu_s']:.2f} CPU-s), warm_up "
                      f"{c['warm_up_wall_s']:.2f} s ({c['warm_up_cpu_s']:.2f} CPU-s), load "
                      f"{c['load']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
