"""The human-readable report of a simulation result."""

from __future__ import annotations

import math


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.3f}"


def _aggregation_line(result: dict) -> str:
    if result.get("aggregation") != "secure":
        return "  aggregation: independent (each site's release carries its own noise draw)"
    line = (f"  aggregation: secure (each site adds 1/{result.get('noise_threshold')} of one "
            f"noise draw; the aggregator saw only the masked sum)")
    dropped = result.get("dropped") or []
    return line + (f"; dropped after key agreement: {', '.join(dropped)}" if dropped else "")


def _left_out_lines(result: dict) -> list[str]:
    """Per site, the rows its row-wise rules left out and why. Counted by the simulation from
    the files it wrote (a real site never sends this); nothing when no site left a row out."""
    sites = [s for s in result["sites"] if (s.get("left_out") or {}).get("rows")]
    if not sites:
        return []
    lines = ["  rows left out by the sites' row-wise rules (counted on this machine from the "
             "files it wrote;", "  a site never sends this count):"]
    for s in result["sites"]:
        gaps = s.get("left_out") or {}
        lines.append(f"    {s['site_id']:<9} {gaps.get('rows', 0)} of {gaps.get('rows_in_file', 0)} "
                     f"rows left out")
        for entry in gaps.get("reasons", []):
            where = ", ".join(f"{c} {k}" for c, k in entry["columns"].items())
            lines.append(f"      {entry['reason']:<15} {entry['rows']:>5}"
                         + (f"  ({where})" if where else ""))
    return lines + [""]


def format_report(result: dict) -> str:
    """The human-readable result of ``run_simulation``."""
    m, t = result["metrics"], result["timings"]
    lines = [
        f"round {result['round_id']}: {result['data']}",
        f"  {len(result['sites'])} sites, {result['n_public']} public lines, "
        f"{result['n_test']} held-out test lines, d = {len(result['features'])}",
        f"  bounds x {result['bounds']['x_bound']:.3g}, y {result['bounds']['y_bound']:.3g} "
        f"(public sigmas {result['bounds']['sigma_x']:.3g}, {result['bounds']['sigma_y']:.3g})",
        "",
        "  site        n   epsilon spent",
    ]
    for s in result["sites"]:
        lines.append(f"  {s['site_id']:<9} {s['n'] if s['n'] is not None else '-':>4}   "
                     f"{s['epsilon']:.3g}")
    lines += ["", *_left_out_lines(result)]
    lines += [
        f"  timings: round {t['round_s']:.2f} s, fit {t['fit_s']:.1f} s "
        f"({result['fit_method']}), baselines {t['baselines_s']:.1f} s, total {t['total_s']:.1f} s",
        "  phases: " + ", ".join(f"{p['phase'].lower()} {p['seconds']:.2f} s"
                                 for p in result.get("phases", [])),
        _aggregation_line(result),
        "",
        "  held-out Spearman correlation (predicted vs measured)",
        f"    private federated model   {_fmt(m['spearman_private'])}",
        f"    non-private (all rows)    {_fmt(m['spearman_nonprivate'])}",
        f"    public lines only         {_fmt(m['spearman_public_only'])}",
        "",
    ]
    forecast = (result.get("forecast") or {}).get("gain")
    if forecast and forecast.get("mean") is not None:
        realised = m["spearman_private"] - m["spearman_public_only"]
        lines += [f"  gain over public lines only: realised {realised:+.3f}; forecast before the "
                  f"round {forecast['mean']:+.3f}",
                  f"    (10-90 % {forecast['q10']:+.3f} to {forecast['q90']:+.3f}; `dpfed plan`, "
                  "public inputs only)", ""]
    info = result.get("information") or {}
    if info.get("text"):
        lines += [f"  {'WARNING: ' if info.get('verdict') == 'little' else ''}{info['text']}", ""]
    model = result.get("model") or "?"
    if model == "noise-aware":
        about = ["  The 90 % intervals account for the privacy noise (noise-aware posterior,",
                 f"  noise: {result.get('noise', '?')})."]
    else:
        about = [f"  The 90 % intervals come from the {model} model: they do NOT account for the",
                 "  privacy noise and are too narrow."]
    lines += [
        "  features by |posterior mean| of the private model.",
        *about,
        "  The private model saw clipped features, so compare signs and ranks with the",
        "  non-private means, not magnitudes.",
        f"    {'feature':<24} {'private':>8}  {'90 % interval':<18}  non-private",
    ]
    nonprivate = dict(zip(result["features"], result.get("nonprivate_beta_mean", [])))
    for row in result["top_features"]:
        ci = row.get("ci90")
        ci_text = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
        ref = nonprivate.get(row["feature"])
        ref_text = f"{ref:+.3f}" if ref is not None else ""
        lines.append(f"    {row['feature']:<24} {row['mean']:+8.3f}  {ci_text:<18}  {ref_text}")
    if result.get("workdir"):
        lines += ["", f"  work folder kept: {result['workdir']}"]
    return "\n".join(lines)
