"""Results of ``dpfed evaluate``: CSV of every cell, summary table, plots, published reference.

Summary statistics of a (method, epsilon, n_private, sites, aggregation) group of rows
(``aggregation``: "independent" or "secure", issue 10; rows of a results.csv written before
that column existed are read as "independent"):

- ``spearman_mean``: mean over every (drug, repeat) cell with a defined correlation (a constant
  prediction has none and is counted in ``undefined``), as in the paper (mean over drugs and
  repeats);
- ``spearman_sd``: standard deviation over repeats of the per-repeat mean over drugs -- the
  spread of the paper's quantity from one Monte Carlo repeat to the next (method.md section 5:
  ~0.04-0.07); NaN with a single repeat;
- ``drugs``/``repeats``: how many distinct drugs / repeats the group covers (sizes above a
  drug's private pool are skipped, so large n cover fewer drugs).

Plots (matplotlib, Agg backend): Spearman vs private n, one line per method (robust_private per
K and aggregation, secure dash-dotted), one figure per epsilon: the analogue of the paper's
Figures 2 (eps = 2) and 6 (eps = 1).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from dpfed_apps.evaluation.published import PUBLISHED, PUBLISHED_RATIO_N800, SIZES, published_value
from dpfed_apps.evaluation.runner import ROW_FIELDS

__all__ = ["summarise", "write_csv", "read_csv", "markdown_table", "published_table",
           "ratio_table", "plot_curves", "write_report", "label"]


def label(method: str, sites: int, aggregation: str = "independent") -> str:
    if method != "robust_private":
        return method
    return f"{method} (K={sites}{', secure' if aggregation == 'secure' else ''})"


def _aggregation(row: dict) -> str:
    return row.get("aggregation") or "independent"


def _key(row: dict):
    eps = row["epsilon"]
    return (row["method"], None if eps is None or (isinstance(eps, float) and math.isnan(eps))
            else float(eps), int(row["n_private"]), int(row["sites"]), _aggregation(row))


def summarise(rows: Iterable[dict]) -> list[dict]:
    """One dict per (method, epsilon, n_private, sites, aggregation) (module docstring),
    sorted."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[_key(row)].append(row)
    out = []
    for (method, eps, n, k, agg), rs in groups.items():
        vals = np.array([float(r["spearman"]) for r in rs], dtype=np.float64)
        ok = np.isfinite(vals)
        by_repeat: dict[int, list[float]] = defaultdict(list)
        for r, v in zip(rs, vals):
            if math.isfinite(v):
                by_repeat[int(r["repeat"])].append(v)
        rep_means = np.array([np.mean(v) for v in by_repeat.values()])
        out.append(dict(
            method=method, epsilon=eps, n_private=n, sites=k, aggregation=agg,
            spearman_mean=float(np.mean(vals[ok])) if ok.any() else float("nan"),
            spearman_sd=float(np.std(rep_means, ddof=1)) if rep_means.size > 1 else float("nan"),
            drugs=len({int(r["drug"]) for r in rs}), repeats=len({int(r["repeat"]) for r in rs}),
            cells=len(rs), undefined=int(np.sum(~ok & np.array([not r.get("error") for r in rs]))),
            errors=sum(1 for r in rs if r.get("error")),
            unconverged=sum(1 for r in rs if r.get("converged") is False)))
    out.sort(key=lambda s: (s["method"], -1 if s["epsilon"] is None else s["epsilon"],
                            s["sites"], s["aggregation"], s["n_private"]))
    return out


def write_csv(rows: Iterable[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=ROW_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in ROW_FIELDS})


def read_csv(path: Path) -> list[dict]:
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            rows.append(dict(drug=int(r["drug"]), repeat=int(r["repeat"]), method=r["method"],
                             epsilon=float(r["epsilon"]) if r["epsilon"] else None,
                             n_private=int(r["n_private"]), sites=int(r["sites"]),
                             spearman=float(r["spearman"]) if r["spearman"] else float("nan"),
                             converged=None if r["converged"] == "" else r["converged"] == "True",
                             error=r["error"] or None,
                             aggregation=r.get("aggregation") or "independent",
                             noise_threshold=int(r["noise_threshold"])
                             if r.get("noise_threshold") else None))
    return rows


def _fmt(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def markdown_table(summary: Sequence[dict]) -> str:
    """Rows: method (and eps, K); columns: private n; cells 'mean ± sd'."""
    sizes = sorted({s["n_private"] for s in summary})
    cells: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for s in summary:
        cells[(s["method"], s["epsilon"], s["sites"], s["aggregation"])][s["n_private"]] = s
    head = "| method | eps | " + " | ".join(str(n) for n in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 2)]
    for (method, eps, k, agg), by_n in cells.items():
        vals = []
        for n in sizes:
            s = by_n.get(n)
            if s is None:
                vals.append("")
                continue
            sd = _fmt(s["spearman_sd"])
            vals.append(_fmt(s["spearman_mean"]) + (f" ± {sd}" if sd else ""))
        lines.append(f"| {label(method, k, agg)} | {'' if eps is None else f'{eps:g}'} | "
                     + " | ".join(vals) + " |")
    drugs = {n: max((s["drugs"] for s in summary if s["n_private"] == n), default=0)
             for n in sizes}
    lines.append("| drugs covered | | " + " | ".join(str(drugs[n]) for n in sizes) + " |")
    return "\n".join(lines)


def published_table() -> str:
    lines = ["| published (Honkela et al. 2018) | eps | " + " | ".join(map(str, SIZES)) + " |",
             "|" + "---|" * (len(SIZES) + 2)]
    for (method, eps), values in PUBLISHED.items():
        lines.append(f"| {method} | {'' if eps is None else f'{eps:g}'} | "
                     + " | ".join(f"{v:.3f}" for v in values) + " |")
    return "\n".join(lines)


def ratio_table(rows: Sequence[dict], *, all_sizes: bool = False) -> list[dict]:
    """Private (robust_private, K=1) / non-private mean Spearman per eps at the largest n
    covered, on the *same* (drug, repeat) cells (paired), with the paper's ratio at n = 800.
    ``all_sizes``: one entry per n instead (each over the drugs that reach that n), largest
    n first."""
    by_cell = {}
    for r in rows:
        if math.isfinite(float(r["spearman"])):
            by_cell[(_key(r), int(r["drug"]), int(r["repeat"]))] = float(r["spearman"])
    out = []
    eps_values = sorted({k[0][1] for k in by_cell if k[0][0] == "robust_private"})
    for eps in eps_values:
        sizes = sorted({k[0][2] for k in by_cell if k[0][0] == "robust_private" and k[0][1] == eps})
        for n in reversed(sizes):
            pairs = [(v, by_cell.get((("nonprivate", None, n, 1, "independent"), d, rep)))
                     for (key, d, rep), v in by_cell.items()
                     if key == ("robust_private", eps, n, 1, "independent")]
            pairs = [(p, q) for p, q in pairs if q is not None]
            if pairs:
                priv = float(np.mean([p for p, _ in pairs]))
                nonp = float(np.mean([q for _, q in pairs]))
                out.append(dict(epsilon=eps, n_private=n, private=priv, nonprivate=nonp,
                                ratio=priv / nonp if nonp else float("nan"), cells=len(pairs),
                                published_ratio_n800=PUBLISHED_RATIO_N800.get(eps)))
                if not all_sizes:
                    break
    return out


def plot_curves(summary: Sequence[dict], epsilon: float, path: Path, *, title: str = "") -> None:
    """Spearman vs private n for every method at ``epsilon`` (non-private methods shown in
    every figure), with the published curves dashed for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines: dict[str, list[dict]] = defaultdict(list)
    for s in summary:
        if s["epsilon"] is None or s["epsilon"] == epsilon:
            lines[label(s["method"], s["sites"], s["aggregation"])].append(s)
    for name, ss in sorted(lines.items()):
        ss = sorted(ss, key=lambda s: s["n_private"])
        x = [s["n_private"] for s in ss]
        y = [s["spearman_mean"] for s in ss]
        sd = np.array([s["spearman_sd"] for s in ss], dtype=float)
        secure = ss[0].get("aggregation") == "secure"
        line, = ax.plot(x, y, marker="s" if secure else "o", ms=3, ls="-." if secure else "-",
                        label=name)
        if np.any(np.isfinite(sd)):
            ax.fill_between(x, np.array(y) - sd, np.array(y) + sd, color=line.get_color(),
                            alpha=0.12, lw=0)
    for method in ("robust_private", "nonprivate"):
        pub = [published_value(method, epsilon, n) for n in SIZES]
        ax.plot(SIZES, pub, ls="--", lw=1, color="grey" if method == "nonprivate" else "black",
                label=f"published {method}")
    ax.set_xlabel("private training lines n")
    ax.set_ylabel("Spearman correlation (test lines)")
    ax.set_title(title or f"GDSC v17, d=10, eps={epsilon:g} (mean ± sd over repeats)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: Sequence[dict], out_dir: Path, *, wall_s: float | None = None,
                 command: str = "") -> list[dict]:
    """results.csv, summary.md and spearman_eps{e}.png in ``out_dir``; returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / "results.csv")
    summary = summarise(rows)
    ratios = ratio_table(rows)
    text = ["# dpfed evaluate", ""]
    if command:
        text += [f"Command: `{command}`", ""]
    if wall_s is not None:
        text += [f"Wall time: {wall_s:.1f} s", ""]
    text += ["Mean Spearman correlation ± sd over repeats (of the per-repeat mean over drugs).",
             "", markdown_table(summary), "", "Published reference (method.md section 5):", "",
             published_table(), ""]
    if ratios:
        text += ["Private (robust_private, K=1) / non-private at the largest n covered, same cells:",
                 "", "| eps | n | private | non-private | ratio | paper (n=800) |",
                 "|---|---|---|---|---|---|"]
        for r in ratios:
            text.append(f"| {r['epsilon']:g} | {r['n_private']} | {r['private']:.3f} | "
                        f"{r['nonprivate']:.3f} | {r['ratio']:.2f} | {r['published_ratio_n800']} |")
        text.append("")
        every = [r for r in ratio_table(rows, all_sizes=True) if r["n_private"] > 0]
        text += ["The same ratio at every n (each over the drugs whose pool reaches n; the "
                 "drug sets differ between columns):", "",
                 "| eps | n | cells | private | non-private | ratio |", "|---|---|---|---|---|---|"]
        for r in sorted(every, key=lambda r: (r["epsilon"], r["n_private"])):
            text.append(f"| {r['epsilon']:g} | {r['n_private']} | {r['cells']} | "
                        f"{r['private']:.3f} | {r['nonprivate']:.3f} | {r['ratio']:.2f} |")
        text.append("")
    bad = [s for s in summary if s["errors"] or s["unconverged"] or s["undefined"]]
    if bad:
        text += ["Cells with errors, unconverged ADVI or undefined correlation:", ""]
        for s in bad:
            text.append(f"- {label(s['method'], s['sites'], s['aggregation'])} eps={s['epsilon']} n={s['n_private']}: "
                        f"{s['errors']} errors, {s['unconverged']} unconverged, "
                        f"{s['undefined']} undefined of {s['cells']}")
    (out_dir / "summary.md").write_text("\n".join(text) + "\n")
    for eps in sorted({s["epsilon"] for s in summary if s["epsilon"] is not None}):
        plot_curves(summary, eps, out_dir / f"spearman_eps{eps:g}.png")
    return summary
