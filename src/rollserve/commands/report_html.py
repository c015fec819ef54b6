"""The evaluation report as one self-contained HTML file: tables and plots (inline SVG,
no script, nothing fetched), so it opens offline and can be mailed or archived."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from jinja2 import Environment
from markupsafe import Markup

from rollserve.client.evaluation import EvaluationReport, Interval

WIDTH, HEIGHT, PAD = 320, 150, 28


def histogram_svg(
    values: Sequence[float], title: str, bins: int = 10, low: float | None = None, high: float | None = None
) -> str:
    """A bar chart of ``values`` in ``bins`` equal bins over [low, high] (default: their
    range), with the title, the axis ends and the count of the tallest bar."""
    label = html.escape(title)
    if not values:
        return (
            f'<svg class="plot" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'aria-label="{label}"><text x="8" y="16">{label}: no values</text></svg>'
        )
    lo = min(values) if low is None else low
    hi = max(values) if high is None else high
    if hi <= lo:
        hi = lo + 1.0
    counts = [0] * bins
    for value in values:
        index = min(bins - 1, max(0, math.floor((value - lo) / (hi - lo) * bins)))
        counts[index] += 1
    top = max(counts)
    plot_w, plot_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    bar_w = plot_w / bins
    bars = []
    for i, count in enumerate(counts):
        h = plot_h * count / top
        x, y = PAD + i * bar_w, PAD + plot_h - h
        bars.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}"><title>{count}</title></rect>'
        )
    return (
        f'<svg class="plot" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{label}"><text x="{PAD}" y="16">{label} (n={len(values)}, '
        f"max bin {top})</text>{''.join(bars)}"
        f'<line x1="{PAD}" y1="{PAD + plot_h}" x2="{PAD + plot_w}" y2="{PAD + plot_h}"/>'
        f'<text x="{PAD}" y="{HEIGHT - 8}">{lo:g}</text>'
        f'<text x="{PAD + plot_w}" y="{HEIGHT - 8}" text-anchor="end">{hi:g}</text></svg>'
    )


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rollserve report: {{ title }}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 20px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.plot rect { fill: #4a7bd0; } .plot line { stroke: #444; } .plot text { font-size: 11px; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
</style></head><body>
<h1>rollserve evaluation: {{ title }}</h1>
<p>A scored sample (not masked, with a reward) passes at reward &ge; {{ report.threshold }}.
pass@k: the unbiased estimator over tasks with at least k scored samples. maj@n: the answer
most samples extracted is right. The interval is Student's t (95%) over tasks' mean rewards.</p>
<table><tr><th>data_source</th><th>tasks</th><th>rollouts</th><th>scored</th><th>masked</th>
<th>mean reward</th><th>95% CI</th>{% for k in report.ks %}<th>pass@{{ k }}</th>{% endfor %}
<th>maj@n</th></tr>
{% for s in report.sources %}<tr><td>{{ s.data_source }}</td><td>{{ s.tasks }}</td>
<td>{{ s.samples }}</td><td>{{ s.scored }}</td><td>{{ s.masked }}</td>
<td>{{ fmt(s.mean_reward) }}</td>
<td>{{ interval(s.mean_reward_ci95) }}</td>
{% for k in report.ks %}<td>{{ fmt(s.pass_at_k.get(k)) }}</td>{% endfor %}
<td>{{ fmt(s.majority) }}</td></tr>
{% endfor %}</table>
{% for s in report.sources %}
<h2>{{ s.data_source }}</h2>
<p>statuses: {{ counts(s.statuses) }}{% if s.failures %}; failures: {{ counts(s.failures) }}
{%- endif %}{% if s.mask_reasons %}; masked: {{ counts(s.mask_reasons) }}{% endif %}</p>
{% if s.components %}<table><tr><th>reward component</th><th>samples</th><th>mean</th>
<th>p50</th></tr>{% for name, d in s.components.items() %}<tr><td>{{ name }}</td>
<td>{{ d.values|length }}</td><td>{{ fmt(d.mean) }}</td><td>{{ fmt(d.p50) }}</td></tr>
{% endfor %}</table>{% endif %}
<div class="plots">{{ plots[s.data_source] }}</div>
{% endfor %}
</body></html>
"""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(ci: Interval | None) -> str:
    return "-" if ci is None else f"{ci.low:.3f} to {ci.high:.3f}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items())


def render_html(report: EvaluationReport, title: str) -> str:
    plots = {}
    for source in report.sources:
        low = min([0.0, *source.rewards])
        high = max([1.0, *source.rewards])
        plots[source.data_source] = "".join(
            (
                histogram_svg(source.rewards, "reward", low=low, high=high),
                histogram_svg(source.turns.values, "turns"),
                histogram_svg(source.seconds.values, "seconds per rollout"),
            )
        )
    environment = Environment(autoescape=True)
    template = environment.from_string(TEMPLATE)
    # The plots are built here from numbers and escaped titles: marked safe for jinja.
    return template.render(
        report=report,
        title=title,
        fmt=_fmt,
        interval=_interval,
        counts=_counts,
        plots={name: Markup(svg) for name, svg in plots.items()},
    )
