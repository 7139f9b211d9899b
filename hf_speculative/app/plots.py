"""The figure shown after a comparison: tokens over time, and accepted draft length per step.

Built on a bare ``matplotlib.figure.Figure`` (no pyplot): pyplot keeps global state that is not safe
across the server's worker threads, and a bare figure is freed with its last reference.
"""

from __future__ import annotations

from typing import Sequence

from ..extras import require
from .streaming import MethodTrace

Figure = require("matplotlib.figure", "app", "The demo app").Figure


def comparison_figure(traces: Sequence[MethodTrace], labels: Sequence[str] | None = None) -> Figure | None:
    """Two panels: cumulative new tokens against wall time per method (steeper = faster), and the
    number of draft tokens accepted at each target forward (0 = the forward gave one token).

    Args:
        labels (`Sequence[str]`, *optional*): the legend's name of each trace (default: the method's label; the
            page passes its pane titles, e.g. "Plain sampling" for the baseline of a sampled run).

    Returns ``None`` when no method produced a token.
    """
    names = {id(t): label for t, label in zip(traces, labels or [t.spec.label for t in traces])}
    shown = [t for t in traces if t.token_times]
    if not shown:
        return None
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    over_time, per_step = fig.subplots(1, 2)
    for trace in shown:
        with trace.lock:
            times = [0.0] + [t for t, _ in trace.token_times]
            tokens = [0] + [n for _, n in trace.token_times]
            accepted = list(trace.accepted_lengths)
        label = names[id(trace)]
        over_time.step(times, tokens, where="post", label=label)
        per_step.plot(range(1, len(accepted) + 1), accepted, marker="o", markersize=3, linewidth=1, label=label)
    over_time.set(title="Tokens over time", xlabel="seconds", ylabel="new tokens")
    per_step.set(title="Accepted draft tokens per target forward", xlabel="target forward", ylabel="accepted")
    per_step.yaxis.get_major_locator().set_params(integer=True)
    # whole axes from 0 even when nothing moved (all zeros would autoscale to ±0.04 around 0)
    top = max([max(t.accepted_lengths, default=0) for t in shown] + [1])
    per_step.set_ylim(-0.2, top + 0.5)
    over_time.set_ylim(bottom=0, top=max([t.new_tokens for t in shown] + [1]) * 1.05)
    over_time.set_xlim(left=0)
    for ax in (over_time, per_step):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig
