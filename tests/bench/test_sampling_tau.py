"""benchmarks/sampling_tau.py (issue 45's measurement): its rows carry the counts a pooled τ needs, ``--resume`` runs
only the prompts ``--out`` lacks and pools the rest from the file, ``--no-timing`` times nothing."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from tests.conftest import load_benchmark

tau = load_benchmark("sampling_tau")
# the tool's rows, resume and pooling, not transformers' sampling (tests/core and tests/drafters check that on both
# versions): CI runs these on 5.x only
pytestmark = pytest.mark.single_version

ARGS = ["--categories", "qa,translation", "--per-category", "1", "--seeds", "2", "--max-new-tokens", "6",
        "--methods", "lookup", "--modes", "seeded,rejection", "--no-timing"]


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    """The run on the qa prompt alone that both resume tests start from (run once for the module): its file and what
    it printed. Each test resumes from a copy (:func:`qa_file`)."""
    out = tmp_path_factory.mktemp("qa") / "tau.jsonl"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        tau.main([*ARGS, "--categories", "qa", "--out", str(out)])
    return out, printed.getvalue()


def qa_file(qa_run, tmp_path):
    out = tmp_path / "tau.jsonl"
    shutil.copy(qa_run[0], out)
    return out


@pytest.mark.integration
def test_resume_runs_only_what_the_file_lacks_and_pools_both(qa_run, tmp_path, capsys):
    out = qa_file(qa_run, tmp_path)
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(first) == 1 and set(first[0]["counts"]) == {"lookup/seeded", "lookup/rejection"}
    assert all(len(counts) == 2 for counts in first[0]["counts"].values())
    assert "lookup/seeded: tau" in qa_run[1] and "tokens/s" not in qa_run[1]  # --no-timing: no speed figures
    tau.main([*ARGS, "--out", str(out), "--resume"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["category"] for r in rows] == ["qa", "translation"]  # qa kept, not run again
    summary = capsys.readouterr().out
    pooled = sum(c[0] for r in rows for c in r["counts"]["lookup/seeded"])
    assert "lookup/seeded: tau" in summary and f"{pooled} tokens" in summary
    # another temperature is another measurement: nothing of the file is reused
    assert tau.finished(tau_args(out, "--temperature", "1.0"), ["lookup/seeded", "lookup/rejection"]) == {}


def tau_args(out, *extra):
    import argparse

    return argparse.Namespace(out=str(out), temperature=float(extra[1]) if extra else 0.7, max_new_tokens=6, seeds=2)


@pytest.mark.integration
def test_prompt_seeds_are_the_prompt_s_own_and_are_another_measurement(qa_run, tmp_path):
    """``--prompt-seeds``: each prompt's calls get seeds of their own (the seeded rule keys its noise by absolute
    position, so shared seeds make every prompt read the same noise); rows say so, and --resume keeps the two apart."""
    import argparse

    shared, own = argparse.Namespace(prompt_seeds=False), argparse.Namespace(prompt_seeds=True)
    assert [tau.call_seed(shared, q, 1) for q in (81, 82)] == [1, 1]
    assert len({tau.call_seed(own, q, s) for q in (81, 82) for s in range(3)}) == 6
    out = qa_file(qa_run, tmp_path)
    methods = ["lookup/seeded", "lookup/rejection"]
    assert len(tau.finished(tau_args(out), methods)) == 1
    assert tau.finished(argparse.Namespace(**{**vars(tau_args(out)), "prompt_seeds": True}), methods) == {}
    tau.main([*ARGS, "--categories", "qa", "--out", str(out), "--prompt-seeds", "--resume"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("prompt_seeds", False) for r in rows] == [False, True]


@pytest.mark.integration
def test_timed_rows_carry_each_arm_s_seconds_and_the_summary_their_median(tmp_path, capsys):
    """Timed runs (no --no-timing): every arm warms up untimed, each row keeps its prompt's [tokens, seconds] by arm,
    and the summary gives the median of the per-prompt ratios beside the pooled one (no time is asserted)."""
    out = tmp_path / "tau.jsonl"
    args = [a for a in ARGS if a != "--no-timing"]
    tau.main([*args, "--seeds", "1", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert set(row["seconds"]) == {"plain", "lookup/seeded", "lookup/rejection"}
        assert all(new > 0 and wall > 0 for new, wall in row["seconds"].values())
        assert row["seconds"]["lookup/seeded"][0] == row["counts"]["lookup/seeded"][0][0]
    assert "(median over 2 prompts" in capsys.readouterr().out
    ratios = tau.prompt_ratios(rows, ["lookup/seeded"])["lookup/seeded"]
    (new, wall), (plain_new, plain_wall) = rows[0]["seconds"]["lookup/seeded"], rows[0]["seconds"]["plain"]
    assert ratios[0] == pytest.approx((new / wall) / (plain_new / plain_wall))
    assert tau.prompt_ratios([{"counts": {}}], ["lookup/seeded"]) == {"lookup/seeded": []}  # untimed rows: none
