"""The end-of-run figure draws what the traces measured."""

from __future__ import annotations

from hf_speculative.app.plots import comparison_figure
from hf_speculative.app.streaming import MethodTrace
from hf_speculative.tooling.methods import get_method


def _trace(name, blocks):
    trace = MethodTrace(get_method(name), 100)
    trace.started = 0.0
    for i, block in enumerate(blocks):
        trace.add_block(block, 0.1 * (i + 1))
    return trace


def test_figure_has_tokens_over_time_and_accepted_lengths():
    greedy = _trace("greedy", [[1], [2], [3], [4]])
    lookup = _trace("prompt-lookup", [[1], [2, 3, 4]])
    fig = comparison_figure([greedy, lookup, MethodTrace(get_method("hf-prompt-lookup"), 10)])
    over_time, per_step = fig.axes
    assert [line.get_label() for line in over_time.get_lines()] == ["Greedy", "Prompt lookup (hfs)"]
    x, y = over_time.get_lines()[1].get_data()
    assert list(y) == [0, 1, 4] and list(x) == [0.0, 0.1, 0.2]
    assert list(per_step.get_lines()[1].get_ydata()) == [0, 2]
    assert list(per_step.get_lines()[0].get_ydata()) == [0, 0, 0, 0]
    assert comparison_figure([MethodTrace(get_method("greedy"), 4)]) is None
