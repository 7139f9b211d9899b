"""tools/gpu/app_run.py: the page's comparison engine on a model folder, without the page (for a lent GPU)."""

from __future__ import annotations

import json

import pytest

from tools.gpu import app_run


def test_every_example_runs_every_round_and_the_plot_is_drawn_from_the_saved_results(chat_checkpoint, tmp_path,
                                                                                     cheap_verification):
    report = app_run.run_app(chat_checkpoint, str(chat_checkpoint), ["prompt-lookup", "suffix"],
                             {"a": "Repeat: one two three one two three", "b": "Say hello."}, max_new_tokens=8,
                             rounds=2, device="cpu")
    assert report["methods"] == ["greedy", "prompt-lookup", "suffix"]
    assert [len(runs) for runs in report["prompts"].values()] == [2, 2]
    for runs in report["prompts"].values():
        for run in runs:
            greedy, *others = run["methods"]
            assert greedy["route"] == "plain" and all(r["route"] == "ours" for r in others)
            assert all(r["status"] == "done" and r["identical_to_baseline"] for r in others)
            assert all(r["token_times"][-1][1] == r["new_tokens"] for r in run["methods"])
    summary = report["summary"]
    assert summary["prompt-lookup"]["prompts"] == summary["prompt-lookup"]["identical"] == 2
    assert summary["greedy"]["speedup"] == 1.0 and summary["suffix"]["tau"] >= 1
    first = report["prompts"]["a"][0]
    over_time, _ = app_run.figure_from_results(first).axes
    assert over_time.get_ylim()[1] >= max(r["new_tokens"] for r in first["methods"])  # every token on the axis
    (tmp_path / "app_results.json").write_text(json.dumps(report))
    assert app_run.main(["--model-dir", "unused", "--out", str(tmp_path), "--plots", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("app_plot_*.png")) == ["app_plot_0.png", "app_plot_1.png"]


def test_more_methods_than_the_page_shows_are_refused(chat_checkpoint):
    with pytest.raises(SystemExit, match="at most 3 methods"):
        app_run.run_app(chat_checkpoint, "x", ["prompt-lookup", "suffix", "eagle", "medusa"], {}, 8, 1, "cpu")
