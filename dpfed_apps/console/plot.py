"""The posterior's coefficients as an SVG interval plot: a pure function, no plotting library.

One row per feature: a bar for the credible interval and a dot at the posterior mean, on one
horizontal axis shared by every row, with a line at zero. When the public-only posterior is
given, its interval is drawn just below each bar, dashed and grey. Every text is escaped;
non-finite numbers (null in the summary JSON) leave the row with the words "no estimate".
The SVG carries no script and no style attribute (the console's Content-Security-Policy
allows neither inline), only presentation attributes and classes of console.css.
"""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

ROW = 26            # px per feature row
LABEL_W = 170       # px for the feature names
PLOT_W = 420        # px for the axis
PAD = 12
AXIS_H = 34


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round numbers covering [lo, hi] (1, 2 or 5 times a power of ten)."""
    if not (_finite(lo, hi) and hi > lo):
        return [lo] if _finite(lo) else []
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = min((m * power for m in (1, 2, 5, 10)), key=lambda s: abs(s - raw))
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + 1e-9 * step:
        ticks.append(0.0 if abs(t) < step * 1e-9 else round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def interval_plot(names: Sequence[str], means: Sequence, intervals: Sequence, *,
                  reference: Sequence | None = None, level: float = 0.9,
                  reference_label: str = "public rows alone") -> str:
    """The SVG (a string) of the module docstring. ``intervals``: (lower, upper) per feature;
    ``reference``: (lower, upper) per feature of the public-only posterior, or None."""
    n = len(names)
    if len(means) != n or len(intervals) != n or (reference is not None and len(reference) != n):
        raise ValueError("names, means, intervals (and reference) need one entry per feature")
    values = [0.0]
    for m, iv in zip(means, intervals):
        values += [v for v in (m, *(iv or (None, None))) if _finite(v)]
    for iv in reference or ():
        values += [v for v in (iv or (None, None)) if _finite(v)]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    span = hi - lo
    lo, hi = lo - 0.05 * span, hi + 0.05 * span
    ticks = nice_ticks(lo, hi)
    lo, hi = min([lo, *ticks]), max([hi, *ticks])

    def x(v: float) -> float:
        return LABEL_W + PAD + (v - lo) / (hi - lo) * PLOT_W

    width = LABEL_W + PLOT_W + 2 * PAD
    legend_h = 22 if reference is None else 40
    height = n * ROW + AXIS_H + legend_h + PAD
    top = legend_h
    title = f"Posterior mean and {level:.0%} credible interval of each coefficient"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="interval-plot" role="img" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>"]
    # legend
    out.append(f'<g class="legend"><line x1="{LABEL_W + PAD}" y1="10" x2="{LABEL_W + PAD + 24}" '
               f'y2="10" class="ci" stroke-width="4"/><circle cx="{LABEL_W + PAD + 12}" cy="10" '
               f'r="4" class="mean"/><text x="{LABEL_W + PAD + 30}" y="14">this round, '
               f'{level:.0%} interval</text>')
    if reference is not None:
        x0 = LABEL_W + PAD
        out.append(f'<line x1="{x0}" y1="28" x2="{x0 + 24}" y2="28" class="ref" '
                   f'stroke-dasharray="4 3" stroke-width="2"/><text x="{x0 + 30}" y="32">'
                   f'{escape(reference_label)}</text>')
    out.append("</g>")
    # grid and zero line
    axis_y = top + n * ROW + 4
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{axis_y}" '
                   f'class="grid"/>')
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle" '
                   f'class="tick">{escape(_fmt(t))}</text>')
    out.append(f'<line x1="{x(0.0):.1f}" y1="{top}" x2="{x(0.0):.1f}" y2="{axis_y}" '
               f'class="zero"/>')
    out.append(f'<line x1="{LABEL_W + PAD}" y1="{axis_y}" x2="{LABEL_W + PAD + PLOT_W}" '
               f'y2="{axis_y}" class="axis"/>')
    for i, (name, m, iv) in enumerate(zip(names, means, intervals)):
        y = top + i * ROW + ROW / 2
        label = escape(str(name))
        out.append(f'<g class="coef" data-feature="{label}">')
        out.append(f'<text x="{LABEL_W}" y="{y + 4:.1f}" text-anchor="end" class="name">'
                   f'{label}</text>')
        a, b = (iv or (None, None))[:2] if iv is not None else (None, None)
        if _finite(m, a, b):
            out.append(f'<line x1="{x(a):.1f}" y1="{y:.1f}" x2="{x(b):.1f}" y2="{y:.1f}" '
                       f'class="ci" stroke-width="4"><title>{label}: mean {escape(_fmt(m))}, '
                       f'{level:.0%} interval [{escape(_fmt(a))}, {escape(_fmt(b))}]</title>'
                       f'</line>')
            out.append(f'<circle cx="{x(m):.1f}" cy="{y:.1f}" r="4" class="mean"/>')
        else:
            out.append(f'<text x="{LABEL_W + PAD + 4}" y="{y + 4:.1f}" class="missing">'
                       f'no estimate</text>')
        if reference is not None and reference[i] is not None and _finite(*reference[i][:2]):
            ra, rb = reference[i][:2]
            out.append(f'<line x1="{x(ra):.1f}" y1="{y + 7:.1f}" x2="{x(rb):.1f}" '
                       f'y2="{y + 7:.1f}" class="ref" stroke-dasharray="4 3" stroke-width="2">'
                       f'<title>{label}, {escape(reference_label)}: [{escape(_fmt(ra))}, '
                       f'{escape(_fmt(rb))}]</title></line>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
