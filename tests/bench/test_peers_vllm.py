"""benchmarks/peers' vLLM engine: the worker's JSON-lines protocol and counters with a fake ``LLM`` (no vLLM needed),
the engine's plan, replies and skips. vLLM itself runs the worker in tests/drafters/test_vllm_serving.py (``-m
vllm``) and in ``benchmarks/peers/run.py --engines vllm``."""

from __future__ import annotations

import importlib
import io
import json
import types
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

run = load_benchmark("peers/run")  # puts benchmarks/peers on sys.path: the engines import their siblings by name
worker = load_benchmark("peers/vllm_worker")
vllm_engine = importlib.import_module("vllm_engine")


def counter(name, value):
    return types.SimpleNamespace(name=name, value=value)


class FakeLLM:
    """Generates ``prompt[-1] + 1, + 2...``; its spec-decode counters grow as vLLM's do (cumulative): every call
    drafts ``drafts`` times 3 tokens and accepts ``accepted`` of them, all at the first position."""

    def __init__(self, drafts=0, accepted=0):
        self.drafts, self.accepted, self.total = drafts, accepted, [0, 0, 0]
        self.calls = []

    def get_metrics(self):
        d, t, a = self.total
        return [counter("vllm:spec_decode_num_drafts", d), counter("vllm:spec_decode_num_draft_tokens", t),
                counter("vllm:spec_decode_num_accepted_tokens", a), counter("vllm:other", 99),
                types.SimpleNamespace(name=worker.PER_POSITION, values=[a, 0, 0])]

    def generate(self, prompts, params, use_tqdm=False):
        ids, n = prompts[0], params
        self.calls.append((ids, n))
        self.total = [self.total[0] + self.drafts, self.total[1] + 3 * self.drafts, self.total[2] + self.accepted]
        out = types.SimpleNamespace(token_ids=[ids[-1] + i for i in range(1, n + 1)])
        return [types.SimpleNamespace(outputs=[out])]


def fake_generate(llm, ids, n):
    ticks = iter([1.0, 1.25])
    return worker.generate_one(llm, ids, n, lambda p: p, lambda k: k, clock=lambda: next(ticks))


def test_one_call_reports_its_own_counters_and_vllms_mean_acceptance_length():
    llm = FakeLLM(drafts=4, accepted=6)
    fake_generate(llm, [5], 2)  # the counters are cumulative: the second call must report only its own
    reply = fake_generate(llm, [7, 8], 3)
    assert reply["output_ids"] == [9, 10, 11] and reply["seconds"] == 0.25
    assert reply["metrics"] == {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 6,
                                "accepted_per_position": [6, 0, 0], "mean_acceptance_length": 2.5}
    assert fake_generate(FakeLLM(), [1], 1)["metrics"]["mean_acceptance_length"] is None  # plain: no drafts


def test_serve_answers_each_line_and_goes_on_after_a_bad_request():
    lines = [json.dumps({"op": "generate", "mode": "ngram", "input_ids": [3], "max_new_tokens": 2, "id": 7}),
             json.dumps({"op": "generate", "mode": "eagle3", "input_ids": [3], "max_new_tokens": 2}),
             json.dumps({"op": "generate", "mode": "plain", "input_ids": [], "max_new_tokens": 2}),
             "not json", json.dumps({"op": "quit"}), json.dumps({"op": "ping"})]
    out = io.StringIO()
    answered = worker.serve(lines, out, {"plain": FakeLLM(), "ngram": FakeLLM(1, 1)}, fake_generate, {"threads": 1})
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answered == 5 and replies[0] == {"ready": True, "modes": ["plain", "ngram"], "threads": 1}
    assert replies[1]["ok"] and replies[1]["output_ids"] == [4, 5] and replies[1]["id"] == 7
    assert "mode 'eagle3' is not loaded; loaded: plain, ngram" in replies[2]["error"]
    assert "needs input_ids" in replies[3]["error"] and not replies[4]["ok"] and replies[5] == {"ok": True}


def test_speculative_configs_of_the_modes():
    assert worker.speculative_config("plain") is None
    assert worker.speculative_config("ngram", tokens=5, max_ngram=3) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert worker.speculative_config("eagle3", eagle3="d", tokens=4) == {
        "method": "eagle3", "model": "d", "num_speculative_tokens": 4}
    with pytest.raises(ValueError, match="needs --eagle3 DIR"):
        worker.speculative_config("eagle3")


def engine(tmp_path, methods, eagle3=None, python=None):
    return vllm_engine.VllmEngine("smollm2-135m-instruct", methods, [[1, 2]], python=python or tmp_path / "python",
                                  eagle3=eagle3, threads=1, num_speculative_tokens=5, max_ngram_size=3,
                                  log=tmp_path / "log", meta={"run_id": "r"}, preload_choice="none")


def test_plan_maps_our_methods_and_notes_the_rest(tmp_path):
    e = engine(tmp_path, ["prompt-lookup", "eagle", "draft-model"])
    assert e.plan() == ["plain", "ngram"] and e.methods == ["greedy", "prompt-lookup"]
    assert any(n.startswith("eagle: no EAGLE-3 drafter") for n in e.notes)
    assert "draft-model: no counterpart" in e.notes
    e = engine(tmp_path, ["eagle"], eagle3="dir")
    assert e.command(Path("m"))[-2:] == ["--eagle3", "dir"] and e.methods == ["greedy", "eagle"]


def test_replies_become_runs():
    metrics = {"drafts": 2, "draft_tokens": 10, "accepted_tokens": 3}
    plain = vllm_engine.run_of_reply("greedy", {"output_ids": [4, 5], "seconds": 0.5, "metrics": metrics})
    assert (plain.output, plain.tau, plain.drafted) == ([4, 5], 1.0, None)
    lookup = vllm_engine.run_of_reply("prompt-lookup", {"output_ids": [4, 5, 6], "seconds": 0.5, "metrics": metrics})
    assert (lookup.drafted, lookup.accepted, lookup.tau) == (10, 3, None) and lookup.extra == {"vllm": metrics}


def test_preload_and_a_missing_venv(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    assert vllm_engine.preload(python, "auto") is None and vllm_engine.preload(python, "none") is None
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_bytes(b"")
    assert vllm_engine.preload(python, "auto") == str(tmp_path / "venv" / "lib" / "libiomp5.so")
    assert vllm_engine.vllm_problem(python) == f"no {python} (make install-vllm)"


def test_run_reports_each_engines_start_and_requests_apart(tmp_path, monkeypatch):
    """``run`` (the -m vllm tests' worker): every run's outputs and counters, its engine's start and its requests'
    seconds apart; a run whose engine fails to start reports its error and the others still run."""
    clock = iter(range(0, 1000, 2))  # every reading 2 s after the last
    monkeypatch.setattr(worker, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    out = io.StringIO()
    monkeypatch.setattr(worker, "_protocol_stdout", lambda: out)
    monkeypatch.setattr(worker, "set_environment", lambda threads, kv_cache_gib: None)

    def load_llm(model, spec, *, threads, max_model_len):
        if spec and spec.get("method") == "broken":
            raise ValueError("draft_id_to_target_id is missing")
        return FakeLLM(drafts=2 if spec else 0, accepted=1 if spec else 0)

    monkeypatch.setattr(worker, "load_llm", load_llm)
    monkeypatch.setattr(worker, "vllm_generate", lambda: lambda llm, ids, n: worker.generate_one(
        llm, ids, n, lambda p: p, lambda k: k, clock=lambda: next(clock)))
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps({"prompts": [[5], [7, 8]], "max_new_tokens": 3, "runs": [
        {"name": "plain", "speculative_config": None}, {"name": "bad", "speculative_config": {"method": "broken"}},
        {"name": "eagle3", "speculative_config": {"method": "eagle3"}}]}))
    assert worker.main(["run", "--model", "m", "--requests", str(requests)]) == 0
    reply = json.loads(out.getvalue().splitlines()[-1])
    runs = reply["runs"]
    assert runs["plain"]["outputs"] == runs["eagle3"]["outputs"] == [[6, 7, 8], [9, 10, 11]]
    assert runs["eagle3"]["metrics"][0]["drafts"] == 2 and runs["plain"]["metrics"][0]["drafts"] == 0
    assert runs["bad"] == {"error": "ValueError: draft_id_to_target_id is missing", "load_seconds": 2}
    assert runs["plain"]["load_seconds"] == 2 and runs["plain"]["generate_seconds"] == 4  # two requests, 2 s each
    assert reply["seconds"] == {"import": 2, "all": reply["seconds"]["all"]} and reply["seconds"]["all"] > 10
