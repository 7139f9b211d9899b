"""The Spec-Bench runner on a tiny random model and a temporary dataset."""

import json

import pytest

from hf_speculative.bench.report import write_report
from hf_speculative.bench.runner import run_bench
from hf_speculative.bench.spec_bench import load_prompts
from spec_bench_rows import write_dataset


@pytest.fixture
def two_prompts(tmp_path):
    return write_dataset(
        tmp_path / "question.jsonl",
        [
            (1, "summarization", "the cat sat on the mat and the cat sat on the mat and the cat"),
            (2, "rag", "code def x return value x def y return value y def x"),
        ],
    )


def test_run_bench_writes_records_and_report(tmp_path, two_prompts, chat_model, chat_tokenizer):
    out = tmp_path / "res" / "results.jsonl"
    records = run_bench(
        chat_model,
        chat_tokenizer,
        ["hf-prompt-lookup"],
        load_prompts(two_prompts),
        out=out,
        model_name="tiny",
        max_new_tokens=12,
        progress=False,
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == records
    assert [(r["question_id"], r["method"]) for r in records] == [
        (1, "greedy"),
        (1, "hf-prompt-lookup"),
        (2, "greedy"),
        (2, "hf-prompt-lookup"),
    ]
    for r in records:
        assert r["model"] == "tiny" and r["threads"] == 1 and r["max_new_tokens"] == 12
        assert r["identical_to_greedy"] is True
        assert r["new_tokens"] == 12 and r["tokens_per_s"] == pytest.approx(12 / r["seconds"])
        assert r["target_forwards"] >= 1 and r["tau"] == pytest.approx(12 / r["target_forwards"])
        assert r["acceptance_rate"] is None and r["drafted"] is None
        for key in ("torch", "transformers", "device", "cpu", "run_id", "category", "accepted", "input_tokens"):
            assert key in r
    assert {r["category"] for r in records} == {"summarization", "rag"}
    assert records[0]["tau"] == 1.0  # greedy: one forward per token

    text, md_path = write_report(out, reference="greedy")
    assert md_path == out.with_suffix(".md") and md_path.read_text() == text
    header = "| method | prompts | tokens/s | speedup | median speedup | tau | acceptance | identical | vs greedy |"
    assert header in text
    for heading in ("### summarization", "### rag", "### overall"):
        assert heading in text
    assert "| hf-prompt-lookup | 2 |" in text and "| 2/2 |" in text


def test_run_bench_repeats_keep_the_median(tmp_path, two_prompts, chat_model, chat_tokenizer):
    out = tmp_path / "r.jsonl"
    records = run_bench(
        chat_model, chat_tokenizer, ["greedy"], load_prompts(two_prompts, ["rag"]), out=out, max_new_tokens=4,
        repeats=3, progress=False,
    )
    assert len(records) == 1 and len(records[0]["seconds_all"]) == 3
    assert records[0]["seconds"] == sorted(records[0]["seconds_all"])[1]
    with pytest.raises(ValueError, match="repeats"):
        run_bench(chat_model, chat_tokenizer, [], load_prompts(two_prompts), out=out, repeats=0)


def test_suffix_repeats_never_draft_their_own_previous_run(tmp_path, two_prompts, chat_model, chat_tokenizer):
    """SuffixDecoding's history is the model's: the warm-up leaves nothing in it and a prompt's output joins once,
    after its repeats (a repeat that saw the previous one's output would copy it whole)."""
    import hf_speculative as hfs

    history = hfs.SuffixDecoding().history(chat_model)
    before = len(history.outputs)
    records = run_bench(chat_model, chat_tokenizer, ["suffix"], load_prompts(two_prompts), out=tmp_path / "r.jsonl",
                        max_new_tokens=8, repeats=2, progress=False)
    assert all(r["identical_to_greedy"] for r in records)
    assert len(history.outputs) == before + 2  # one per prompt: not the warm-up's, not each repeat's


def test_run_bench_with_hfs_prompt_lookup(tmp_path, two_prompts, chat_model, chat_tokenizer):
    records = run_bench(
        chat_model, chat_tokenizer, ["prompt-lookup", "hf-prompt-lookup"], load_prompts(two_prompts),
        out=tmp_path / "r.jsonl", max_new_tokens=16, progress=False,
    )
    hfs_records = [r for r in records if r["method"] == "prompt-lookup"]
    assert len(hfs_records) == 2 and all(r["identical_to_greedy"] for r in records)
    assert all(r["drafted"] is not None and r["tau"] >= 1.0 for r in hfs_records)
    # per-step records (what `hf-speculative project` reads): one per target forward, summing to the totals
    for r in hfs_records:
        steps = r["steps"]
        assert r["shape"] == "chain" and set(steps) == {"drafted", "accepted", "draft_s", "verify_s", "other_s"}
        assert all(len(values) == r["target_forwards"] for values in steps.values())
        assert sum(steps["drafted"]) == r["drafted"] and sum(steps["accepted"]) == r["accepted"]
        assert all(t >= 0 for t in steps["draft_s"]) and all(t > 0 for t in steps["verify_s"])
        assert all(t >= 0 for t in steps["other_s"]) and sum(steps["other_s"]) > 0
    others = [r for r in records if r["method"] != "prompt-lookup"]
    assert all("steps" not in r for r in others)  # greedy and transformers' methods are not observed per step
    assert [r.get("shape") for r in others] == ["chain" if r["method"] == "hf-prompt-lookup" else None for r in others]


def test_a_run_replaces_the_file_unless_append(tmp_path, two_prompts, chat_model, chat_tokenizer):
    out = tmp_path / "r.jsonl"
    kwargs = dict(out=out, max_new_tokens=3, progress=False)
    first = run_bench(chat_model, chat_tokenizer, ["greedy"], load_prompts(two_prompts, ["rag"]), **kwargs)
    second = run_bench(chat_model, chat_tokenizer, ["greedy"], load_prompts(two_prompts, ["rag"]), **kwargs)
    assert [json.loads(line) for line in out.read_text().splitlines()] == second  # the first run's rows are gone
    third = run_bench(chat_model, chat_tokenizer, ["greedy"], load_prompts(two_prompts, ["rag"]), append=True,
                      **kwargs)
    assert [json.loads(line) for line in out.read_text().splitlines()] == second + third
    assert len(first) == len(second) == len(third) == 1


def test_a_cpu_run_records_the_weights_bandwidth(tmp_path, two_prompts, chat_model, chat_tokenizer, monkeypatch):
    from hf_speculative.bench.bandwidth import ENV, weight_bytes

    monkeypatch.setenv(ENV, "19.5")  # measured over 1 GiB otherwise
    out = tmp_path / "r.jsonl"
    records = run_bench(chat_model, chat_tokenizer, ["prompt-lookup"], load_prompts(two_prompts, ["rag"]), out=out,
                        max_new_tokens=4, progress=False)
    for r in records:
        assert r["weight_bytes_per_token"] == weight_bytes(chat_model) and r["read_bandwidth_gbs"] == 19.5
        assert r["read_bandwidth_from"] == ENV
    greedy, lookup = records
    # plain decoding reads the weights once per token; a speculative step does not, so it gets no read rate
    assert greedy["weights_gbs"] == pytest.approx(weight_bytes(chat_model) * greedy["tokens_per_s"] / 1e9)
    assert "weights_gbs" not in lookup
    text, _ = write_report(out)
    assert "greedy (plain decoding): weights " in text
    assert "of this machine's 19.5 GB/s single-thread read (HFS_READ_BANDWIDTH_GBS)" in text
