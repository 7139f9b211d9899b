"""``hf-speculative compare``'s figures from its runs: one row per method, medians over ``--repeats`` runs.

Each method runs ``--repeats`` times, the methods in turn (greedy, a, b, greedy, a, b, ...), so that a slow
moment of the machine falls on every method alike; a row holds the median of each measured figure over the
method's runs, and its speedup is the ratio of the medians of tokens/s (the method's over greedy's). The text is
the first run's; ``identical_to_greedy`` holds only if every run of the method wrote greedy's first text.
"""

from __future__ import annotations

import statistics
from typing import Any


def median_of(values: list[Any]) -> Any:
    """The median of ``values`` (``None`` when any is ``None``: a figure the method does not report)."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)


def summarise(runs: list[list[Any]], tokenizer: Any) -> list[dict]:
    """One row per method from ``runs[i]``, method ``i``'s runs (:class:`~hf_speculative.tooling.methods.MethodRun`,
    in order; ``runs[0]``: greedy's).

    Returns:
        `list[dict]`: per method ``method``, ``text`` and ``new_tokens`` (the first run's), ``seconds``,
        ``tokens_per_s``, ``tau``, ``acceptance_rate``, ``drafted``, ``target_forwards`` (medians), ``speedup``,
        ``identical_to_greedy``,
        ``runs`` and, with more than one run, ``tokens_per_s_runs`` (each run's, in order).
    """
    greedy = runs[0]
    greedy_ids = greedy[0].output_ids
    greedy_speed = median_of([r.tokens_per_s for r in greedy])
    rows = []
    for method_runs in runs:
        first = method_runs[0]
        speed = median_of([r.tokens_per_s for r in method_runs])
        row = {
            "method": first.method,
            "text": tokenizer.decode(first.output_ids, skip_special_tokens=True),
            "new_tokens": first.new_tokens,
            "seconds": median_of([r.seconds for r in method_runs]),
            "tokens_per_s": speed,
            "tau": median_of([r.tau for r in method_runs]),
            "acceptance_rate": median_of([r.acceptance_rate for r in method_runs]),
            "drafted": median_of([r.drafted for r in method_runs]),
            "target_forwards": median_of([r.target_forwards for r in method_runs]),
            "speedup": speed / greedy_speed if greedy_speed else None,
            "identical_to_greedy": all(r.output_ids == greedy_ids for r in method_runs),
            "runs": len(method_runs),
        }
        if len(method_runs) > 1:
            row["tokens_per_s_runs"] = [r.tokens_per_s for r in method_runs]
        rows.append(row)
    return rows
