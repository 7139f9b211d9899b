"""benchmarks/peers/openvino_worker.py: the JSON-lines protocol with fake pipelines (no openvino needed), and once
with OpenVINO GenAI itself (``-m openvino``: the OpenVINO venv of ``make install-openvino``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"
OV_PYTHON = ROOT / ".venv-ov" / "bin" / "python"

worker = load_benchmark("peers/openvino_worker")


class Config:
    """openvino_genai.GenerationConfig's stand-in: attributes only."""


class FakePipe:
    """Echoes nothing of the prompt; generates ``prompt[-1] + 1, + 2...``; reports its inferences as OpenVINO
    GenAI's raw metrics do (prompt lookup: fewer, several tokens each)."""

    def __init__(self, per_call: int = 1, echo: bool = False):
        self.per_call, self.echo, self.calls = per_call, echo, []

    def get_generation_config(self):
        config = Config()
        config.eos_token_id = 2
        return config

    def generate(self, inputs, config):
        self.calls.append((inputs, config))
        n = config.max_new_tokens
        new = [inputs[-1] + i + 1 for i in range(n)]
        sizes = [1] + [self.per_call] * ((n - 1) // self.per_call) + ([(n - 1) % self.per_call] if (n - 1) %
                                                                       self.per_call else [])
        raw = types.SimpleNamespace(token_infer_durations=[0.1] * len(sizes), m_batch_sizes=sizes)
        perf = types.SimpleNamespace(get_num_generated_tokens=lambda: n, get_generate_duration=lambda: types.
                                     SimpleNamespace(mean=12.5), raw_metrics=raw)
        return types.SimpleNamespace(tokens=[(list(inputs) if self.echo else []) + new], perf_metrics=perf,
                                     extended_perf_metrics=None)


GENAI = types.SimpleNamespace(GenerationConfig=Config)


def _ticks():
    t = iter(range(100))
    return lambda: float(next(t))


def test_generation_config_starts_from_the_pipelines_own():
    pipe = FakePipe()
    plain = worker.generation_config(GENAI, {"mode": "plain", "max_new_tokens": 8}, pipe)
    assert plain.max_new_tokens == 8 and plain.do_sample is False and plain.eos_token_id == 2
    assert not hasattr(plain, "num_assistant_tokens") and not hasattr(plain, "max_ngram_size")
    lookup = worker.generation_config(GENAI, {"mode": "prompt_lookup", "max_new_tokens": 8,
                                              "num_assistant_tokens": 4, "max_ngram_size": 2}, pipe)
    assert (lookup.num_assistant_tokens, lookup.max_ngram_size) == (4, 2)
    draft = worker.generation_config(GENAI, {"mode": "draft_model", "max_new_tokens": 8})
    assert draft.num_assistant_tokens == 5 and not hasattr(draft, "max_ngram_size")


def test_handle_answers_ids_time_and_metrics():
    pipes = {"plain": FakePipe(), "prompt_lookup": FakePipe(per_call=3, echo=True)}
    reply = worker.handle({"op": "generate", "mode": "prompt_lookup", "input_ids": [5, 6, 7], "max_new_tokens": 7,
                           "id": 3}, pipes, GENAI, make_inputs=list, decode=lambda ids: " ".join(map(str, ids)),
                          clock=_ticks())
    assert reply["ok"] and reply["id"] == 3 and reply["seconds"] == 1.0
    assert reply["output_ids"] == [8, 9, 10, 11, 12, 13, 14]  # the echoed prompt dropped
    assert reply["text"] == "8 9 10 11 12 13 14"
    assert reply["metrics"]["infer_calls"] == 3 and reply["metrics"]["tokens_per_call"] == [1, 3, 3]
    assert reply["metrics"]["generate_ms"] == 12.5 and reply["metrics"]["generated_tokens"] == 7
    assert pipes["prompt_lookup"].calls[0][1].max_ngram_size == 3
    with pytest.raises(ValueError, match="not loaded; loaded: plain, prompt_lookup"):
        worker.handle({"mode": "eagle3", "input_ids": [1], "max_new_tokens": 2}, pipes, GENAI, list)
    with pytest.raises(ValueError, match="needs input_ids"):
        worker.handle({"mode": "plain", "max_new_tokens": 2}, pipes, GENAI, list)


def test_serve_answers_every_line_and_stops_at_quit():
    lines = [json.dumps({"op": "ping"}), "", "not json", json.dumps({"mode": "plain", "input_ids": [1],
                                                                      "max_new_tokens": 2, "id": "a"}),
             json.dumps({"op": "bogus"}), json.dumps({"op": "quit"}), json.dumps({"op": "ping"})]
    out = io.StringIO()
    answered = worker.serve(iter(lines), out, {"plain": FakePipe()}, GENAI, list, ready={"versions": {"x": "1"}})
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answered == 5  # the blank line is skipped, nothing after quit is read
    assert replies[0] == {"ready": True, "modes": ["plain"], "versions": {"x": "1"}}
    assert replies[1] == {"ok": True, "modes": ["plain"]}
    assert replies[2]["ok"] is False and "JSONDecodeError" in replies[2]["error"]
    assert replies[3]["ok"] and replies[3]["id"] == "a" and replies[3]["output_ids"] == [2, 3]
    assert replies[4]["ok"] is False and "unknown op 'bogus'" in replies[4]["error"]
    assert replies[5] == {"ok": True}


def test_metrics_of_reads_the_extended_metrics_of_a_draft_model():
    def perf(tokens, calls):
        raw = types.SimpleNamespace(token_infer_durations=[1.0] * calls, m_batch_sizes=[1] * calls)
        return types.SimpleNamespace(get_num_generated_tokens=lambda: tokens, raw_metrics=raw,
                                     get_ttft=lambda: (_ for _ in ()).throw(RuntimeError("not measured")))

    extended = types.SimpleNamespace(get_num_accepted_tokens=lambda: 9, main_model_metrics=perf(16, 6),
                                     draft_model_metrics=perf(30, 30))
    found = worker.metrics_of(types.SimpleNamespace(perf_metrics=perf(16, 6), extended_perf_metrics=extended))
    assert found["accepted_tokens"] == 9 and found["main_infer_calls"] == 6 and found["draft_infer_calls"] == 30
    assert found["generated_tokens"] == 16 and "ttft_ms" not in found  # a failing getter is left out


def test_load_pipelines_sets_threads_precision_and_no_prefix_caching():
    made = []

    class Scheduler:
        enable_prefix_caching = True

    def pipeline(model, device, **kwargs):
        made.append((model, device, kwargs))
        return object()

    genai = types.SimpleNamespace(SchedulerConfig=Scheduler, LLMPipeline=pipeline,
                                  draft_model=lambda folder, device, **props: ("draft", folder, props))
    pipes = worker.load_pipelines(genai, "ir", ["plain", "prompt_lookup", "draft_model"], draft="d", threads=1)
    assert list(pipes) == ["plain", "prompt_lookup", "draft_model"]
    for model, device, kwargs in made:
        assert (model, device) == ("ir", "CPU")
        assert kwargs["INFERENCE_NUM_THREADS"] == 1 and kwargs["INFERENCE_PRECISION_HINT"] == "f32"
        assert kwargs["scheduler_config"].enable_prefix_caching is False
    assert "prompt_lookup" not in made[0][2] and made[1][2]["prompt_lookup"] is True
    assert made[2][2]["draft_model"] == ("draft", "d", {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"})
    with pytest.raises(ValueError, match="needs --eagle3"):
        worker.load_pipelines(genai, "ir", ["eagle3"])
    with pytest.raises(ValueError, match="unknown mode"):
        worker.load_pipelines(genai, "ir", ["beam"])
    assert "INFERENCE_PRECISION_HINT" not in worker.device_properties(2, "default")


def test_export_command_is_optimum_intels_fp32_export(tmp_path):
    python = tmp_path / "bin" / "python"
    command = worker.export_command(str(python), "/models/m", "/out")
    assert command[:2] == [str(python), "-m"]  # no optimum-cli beside that python
    assert command[-9:] == ["export", "openvino", "--model", "/models/m", "--task", "text-generation-with-past",
                            "--weight-format", "fp32", "/out"]


def test_the_worker_imports_no_openvino_at_module_level():
    code = f"import sys; sys.path.insert(0, {str(PEERS)!r}); import openvino_worker; " \
           "print(any(m.startswith('openvino') and m != 'openvino_worker' for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _openvino_problem() -> str | None:
    if not OV_PYTHON.exists():
        return f"no {OV_PYTHON.relative_to(ROOT)} (make install-openvino)"
    done = subprocess.run([str(OV_PYTHON), "-c", "import openvino_genai"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"{OV_PYTHON.relative_to(ROOT)} cannot import openvino_genai"


@pytest.mark.openvino
@pytest.mark.slow
@pytest.mark.single_version  # the worker runs in .venv-ov, whatever the test's venv: CI runs it on 5.x only
def test_openvino_plain_and_prompt_lookup_give_the_same_text(tmp_path):
    """The real worker on smollm2's fp32 IR (exported into the cache once): one chat prompt, 8 new tokens, plain and
    prompt lookup, the same ids and text."""
    problem = _openvino_problem()
    if problem:
        pytest.skip(problem)
    from transformers import AutoTokenizer

    from hf_speculative.tooling.prompting import encode_prompt

    run = load_benchmark("peers/run")
    model = "smollm2-135m-instruct"
    tokenizer = AutoTokenizer.from_pretrained(str(run.registry_folder(model)))
    ids = encode_prompt(tokenizer, "Repeat this line: the quick brown fox jumps over the lazy dog.")[0].tolist()
    engine = run.OpenVinoEngine(model, ["prompt-lookup"], [ids], python=OV_PYTHON, draft_model=None, eagle3=None,
                                threads=1, num_assistant_tokens=5, max_ngram_size=3, log=tmp_path / "worker.log",
                                meta={"run_id": "t", "max_new_tokens": 8, "repeats": 1})
    try:
        engine.start()
        assert engine.methods == ["greedy", "prompt-lookup"]
        assert engine.ready["versions"]["openvino_genai"]
        plain = engine.ask(engine.request(0, "greedy", 8))
        lookup = engine.ask(engine.request(0, "prompt-lookup", 8))
    finally:
        engine.close()
    assert 0 < len(plain["output_ids"]) <= 8 and plain["seconds"] > 0
    assert lookup["output_ids"] == plain["output_ids"] and lookup["text"] == plain["text"] and plain["text"]
    assert plain["text"] == tokenizer.decode(plain["output_ids"], skip_special_tokens=True)
    assert plain["metrics"]["infer_calls"] == len(plain["output_ids"])
