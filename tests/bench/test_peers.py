"""benchmarks/peers (run.py and the modules beside it): the interleaved order, the rows and tables, the docs section,
the OpenVINO engine over a fake worker process and the llama.cpp engine over fake programs; our engines end to end on
the real model (``integration``)."""

from __future__ import annotations

import importlib
import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

import hf_speculative
from hf_speculative.bench.spec_bench import Prompt
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"


run = load_benchmark("peers/run")  # puts benchmarks/peers on sys.path: run.py imports its siblings by name
engines, tables = importlib.import_module("engines"), importlib.import_module("tables")
openvino_engine = importlib.import_module("openvino_engine")
llamacpp_engine = importlib.import_module("llamacpp_engine")
PROMPTS = [Prompt(81, "writing", "a"), Prompt(241, "summarization", "b")]


class FakeEngine(engines.Engine):
    """Outputs ``[index, 1, 2...]``; ``wrong`` methods change the last token; times from ``seconds``."""

    def __init__(self, name, methods, calls, seconds=None, wrong=()):
        super().__init__()
        self.name, self.label, self.weights = name, f"{name} label", "fp32"
        self.methods += methods
        self.calls, self.seconds, self.wrong = calls, seconds or {}, wrong
        self.base = {"run_id": "r", "model": "m"}
        self.count = 0

    def run(self, index, method, max_new_tokens):
        self.calls.append((self.name, index, method, max_new_tokens))
        self.count += 1
        out = [index] + list(range(1, max_new_tokens))
        if method in self.wrong:
            out[-1] = -1
        seconds = self.seconds.get(method, 1.0) * (1 + 0.5 * (self.count % 3 == 0))
        return engines.Run(method, out, len(out), seconds, target_forwards=max_new_tokens // 2 if method != "greedy"
                           else max_new_tokens)


def test_interleave_runs_every_engine_and_method_per_prompt_and_round():
    a = FakeEngine("a", ["x"], [])
    b = FakeEngine("b", ["y", "z"], [])
    order = [(i, r, e.name, m) for i, r, e, m in engines.interleave([a, b], prompts=2, repeats=2)]
    one_round = [("a", "greedy"), ("a", "x"), ("b", "greedy"), ("b", "y"), ("b", "z")]
    assert order == [(i, r, e, m) for i in range(2) for r in range(2) for e, m in one_round]


def test_run_all_warms_up_then_interleaves_and_keeps_medians():
    calls: list = []
    a = FakeEngine("a", ["x"], calls, seconds={"greedy": 2.0, "x": 1.0})
    b = FakeEngine("b", ["y"], calls, wrong=("y",))
    written = []
    rows = engines.run_all([a, b], PROMPTS, [10, 20], max_new_tokens=32, repeats=3, on_row=written.append)
    warmup = [("a", 0, "greedy", 16), ("a", 0, "x", 16), ("b", 0, "greedy", 16), ("b", 0, "y", 16)]
    assert calls[:4] == warmup
    assert [c[:3] for c in calls[4:]] == [(e, i, m) for i in range(2) for _ in range(3)
                                          for e, m in [("a", "greedy"), ("a", "x"), ("b", "greedy"), ("b", "y")]]
    assert all(c[3] == 32 for c in calls[4:])
    assert written == rows and len(rows) == 8
    assert [(r["engine"], r["question_id"], r["method"]) for r in rows[:4]] == [
        ("a", 81, "greedy"), ("a", 81, "x"), ("b", 81, "greedy"), ("b", 81, "y")]
    first = rows[1]
    assert len(first["seconds_all"]) == 3 and first["seconds"] == sorted(first["seconds_all"])[1]
    assert first["tokens_per_s"] == first["new_tokens"] / first["seconds"] and first["tau"] == 2.0
    assert first["input_tokens"] == 10 and rows[5]["input_tokens"] == 20
    assert [r["identical_to_greedy"] for r in rows] == [True, True, True, False] * 2
    with pytest.raises(ValueError, match="repeats"):
        engines.run_all([a], PROMPTS, [1, 1], max_new_tokens=4, repeats=0)


def _rows():
    calls: list = []
    a = FakeEngine("hfs-default", ["prompt-lookup", "eagle"], calls, seconds={"greedy": 2.0, "prompt-lookup": 1.0,
                                                                              "eagle": 4.0})
    b = FakeEngine("openvino", ["prompt-lookup"], calls, wrong=("prompt-lookup",))
    a.method_label = lambda m: {"eagle": "EAGLE"}.get(m, m)
    return engines.run_all([a, b], PROMPTS, [10, 20], max_new_tokens=16, repeats=1), [
        {"name": "hfs-default", "label": "ours", "weights": "fp32", "notes": ["hf-assisted: needs --draft-model"]},
        {"name": "openvino", "label": "OpenVINO", "weights": "IR", "notes": ["eagle+lookup: no counterpart",
                                                                             "hf-prompt-lookup: no counterpart"]}]


def test_tables_give_each_engine_its_own_baseline():
    rows, described = _rows()
    compact = tables.compact_table(rows, described).splitlines()
    assert compact[0].startswith("| engine | weights | plain tok/s | prompt lookup tok/s | vs plain |")
    ours = compact[2].split(" | ")
    # seconds per call: 1 × (1.5 every third call of the engine), so aggregate rates are computed, not assumed
    assert ours[0] == "| ours" and ours[1] == "fp32" and ours[-1] == "4/4 |"
    assert "EAGLE" in ours[5] and "(τ 2.00)" in ours[5]
    ov = compact[3].split(" | ")
    assert ov[0] == "| OpenVINO" and ov[5] == "–" and ov[-1] == "0/2 |"
    full = tables.full_table(rows, described).splitlines()
    assert len(full) == 2 + 5
    assert full[2].startswith("| hfs-default | greedy | 2 |") and "| 1.00× | 1.00× |" in full[2]
    assert full[4].startswith("| hfs-default | EAGLE | 2 |")
    assert full[-1].startswith("| openvino | prompt-lookup | 2 |") and full[-1].endswith("| 0/2 |")


def test_markdown_names_machine_versions_command_and_notes():
    rows, described = _rows()
    meta = {"engines": described, "prompts": [81, 241], "load": {"start": [1.0, 0.5, 0.25], "end": [1.5, 1.0, 0.5]},
            "date": "2026-11-27 10:00 UTC", "command": "python benchmarks/peers/run.py --repeats 3", "cpu": "AMD EPYC",
            "cores": 2, "model": "smollm2-135m-instruct", "max_new_tokens": 16, "threads": 1, "repeats": 1,
            "versions": {"torch": "2.13.0", "transformers": "5.24.0", "hf_speculative": "0.1.0",
                         "openvino_venv": {"openvino": "2026.4.1", "openvino_genai": "2026.4.1.0",
                                           "optimum_intel": "2.2.0", "transformers": "5.5.4", "torch": "2.13.0"}},
            "skipped": ["llama.cpp: no --llama-cpp DIR (a built tree) and --gguf FILE given"]}
    text = tables.markdown(rows, meta)
    assert "Measured 2026-11-27 10:00 UTC with `python benchmarks/peers/run.py --repeats 3`." in text
    assert "**Machine:** AMD EPYC, 2 cores; load average (1, 5, 15 min) 1.00 0.50 0.25 at the start" in text
    assert ("**Versions:** torch 2.13.0, transformers 5.24.0, hf_speculative 0.1.0; OpenVINO 2026.4.1, OpenVINO GenAI "
            "2026.4.1.0, optimum-intel 2.2.0 (its venv: transformers 5.5.4, torch 2.13.0).") in text
    assert "2 Spec-Bench first turns (question ids 81, 241)" in text and "1 thread everywhere" in text
    assert ("Not run: llama.cpp: no --llama-cpp DIR (a built tree) and --gguf FILE given; hfs-default hf-assisted: "
            "needs --draft-model; openvino has no counterpart of eagle+lookup, hf-prompt-lookup.") in text


def test_replace_section_and_the_docs_markers(tmp_path):
    page = "# T\n\nbefore\n\n" + tables.BEGIN + "\nold\ntable\n" + tables.END + "\n\nafter\n"
    once = tables.replace_section(page, "new table\n")
    assert once == "# T\n\nbefore\n\n" + tables.BEGIN + "\nnew table\n" + tables.END + "\n\nafter\n"
    assert tables.replace_section(once, "new table") == once
    with pytest.raises(ValueError, match="section"):
        tables.replace_section("no markers", "x")
    docs = run.DOCS.read_text(encoding="utf-8")
    assert docs.count(tables.BEGIN) == 1 and docs.count(tables.END) == 1
    assert docs.index(tables.BEGIN) < docs.index(tables.END)
    path = tmp_path / "benchmark.md"
    path.write_text(docs, encoding="utf-8")
    tables.write_docs(path, "| engine |\n|---|\n")
    written = path.read_text(encoding="utf-8")
    assert written.split(tables.BEGIN)[0] == docs.split(tables.BEGIN)[0]
    assert written.split(tables.END)[1] == docs.split(tables.END)[1]
    assert "| engine |" in written


FAKE_WORKER = """
import sys, types
sys.path.insert(0, {peers!r})
import openvino_worker as w

class Config:
    pass

class Pipe:
    def __init__(self, per_call):
        self.per_call = per_call
    def get_generation_config(self):
        return Config()
    def generate(self, ids, config):
        print("a library's own print", flush=True)  # must not reach the protocol
        n = config.max_new_tokens
        calls = 1 + (n - 1 + self.per_call - 1) // self.per_call
        raw = types.SimpleNamespace(token_infer_durations=[1.0] * calls, m_batch_sizes=[1] * calls)
        return types.SimpleNamespace(tokens=[[ids[-1] + i for i in range(n)]],
                                     perf_metrics=types.SimpleNamespace(raw_metrics=raw), extended_perf_metrics=None)

assert sys.argv[1] == "serve" and "--modes" in sys.argv
modes = sys.argv[sys.argv.index("--modes") + 1].split(",")
out = w._protocol_stdout()
pipes = {{mode: Pipe(3 if mode == "prompt_lookup" else 1) for mode in modes}}
w.serve(sys.stdin, out, pipes, types.SimpleNamespace(GenerationConfig=Config), list,
        ready={{"versions": {{"openvino_genai": "9.9", "optimum_intel": "8.8"}}}})
"""


def test_openvino_engine_over_a_worker_process(tmp_path, monkeypatch):
    fake = tmp_path / "worker.py"
    fake.write_text(FAKE_WORKER.format(peers=str(PEERS)), encoding="utf-8")
    monkeypatch.setattr(openvino_engine, "WORKER", fake)
    monkeypatch.setattr(openvino_engine, "exported", lambda name, python, **kw: tmp_path / f"{name}-ir")
    engine = openvino_engine.OpenVinoEngine(
        "m", ["prompt-lookup", "eagle", "eagle+lookup", "draft-model"], [[4, 5, 6]], python=Path(sys.executable),
        draft_model=None, eagle3=None, threads=1, num_assistant_tokens=5, max_ngram_size=3,
        log=tmp_path / "log" / "w.log", meta={"run_id": "r", "max_new_tokens": 8, "repeats": 1, "cpu": "cpu"})
    try:
        engine.start()
        assert engine.methods == ["greedy", "prompt-lookup"]
        assert [n.split(":")[0] for n in engine.notes] == ["eagle", "eagle+lookup", "draft-model"]
        assert engine.base["openvino_genai"] == "9.9" and "OpenVINO GenAI 9.9 (optimum-intel 8.8" in engine.label
        plain, lookup = engine.run(0, "greedy", 8), engine.run(0, "prompt-lookup", 8)
    finally:
        engine.close()
    assert engine.process is None
    assert plain.output == lookup.output == list(range(6, 14)) and plain.new_tokens == 8
    assert plain.tau == 1.0 and lookup.target_forwards == 4 and lookup.tau == 2.0
    assert "a library's own print" in (tmp_path / "log" / "w.log").read_text()


def test_the_openvino_worker_is_skipped_with_a_reason(tmp_path):
    assert "make install-openvino" in openvino_engine.openvino_problem(tmp_path / "none" / "bin" / "python")
    assert openvino_engine.openvino_python(".venv-ov") == ROOT / ".venv-ov" / "bin" / "python"


LLAMA_PLAIN = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "version: 4242 (deadbeef)" >&2; exit 0; fi
while [ $# -gt 0 ]; do case "$1" in -f) f="$2"; shift;; esac; shift; done
cat "$f"; printf ' The same answer. [end of text]\\n'
echo "llama_perf_context_print: prompt eval time =     100.00 ms /    10 tokens (10.00 ms per token)" >&2
echo "llama_perf_context_print:        eval time =     700.00 ms /     7 runs   (100.00 ms per token)" >&2
"""
LLAMA_LOOKUP = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -f) f="$2"; shift;; esac; shift; done
cat "$f"; printf ' The same answer.'
echo "encoded   10 tokens in    0.100 seconds, speed:  100.000 t/s" >&2
echo "decoded    8 tokens in    0.300 seconds, speed:   26.667 t/s" >&2
echo "n_draft      = 3" >&2
echo "n_predict    = 8" >&2
echo "n_drafted    = 6" >&2
echo "n_accept     = 3" >&2
echo "accept       = 50.000%" >&2
"""


def test_llama_cpp_engine_over_fake_programs(tmp_path):
    bin_dir = tmp_path / "llama" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name, script in (("llama-completion", LLAMA_PLAIN), ("llama-lookup", LLAMA_LOOKUP)):
        path = bin_dir / name
        path.write_text(textwrap.dedent(script), encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    engine = llamacpp_engine.LlamaCppEngine(
        tmp_path / "llama", tmp_path / "m.gguf", ["prompt-lookup", "eagle", "draft-model"],
        ["<|user|>Say it.<|assistant|>"], draft_gguf=None, threads=1, draft_max=3,
        meta={"run_id": "r", "model": "m", "max_new_tokens": 8, "repeats": 1}, workdir=tmp_path / "work")
    engine.start()
    assert engine.methods == ["greedy", "prompt-lookup"] and engine.version == "4242 (deadbeef)"
    assert [n.split(":")[0] for n in engine.notes] == ["eagle", "draft-model"]
    command = engine.command(0, "prompt-lookup", 8)
    assert command[-2:] == ["--draft-max", "3"] and ["-t", "1"] == command[command.index("-t"):][:2]
    plain, lookup = engine.run(0, "greedy", 8), engine.run(0, "prompt-lookup", 8)
    assert plain.output == lookup.output == "The same answer."
    assert (plain.new_tokens, plain.seconds) == (8, pytest.approx(0.8))
    assert (lookup.new_tokens, lookup.seconds, lookup.drafted, lookup.accepted) == (8, pytest.approx(0.4), 6, 3)
    assert lookup.acceptance_rate == 0.5 and engine.method_label("prompt-lookup") == "llama-lookup --draft-max 3"


def test_parse_llama_tells_prompt_eval_from_eval():
    figures = llamacpp_engine.parse_llama(
        "prompt eval time =  12.50 ms /  3 tokens\n       eval time =  40.00 ms /   4 runs\n")
    assert figures == {"prompt_ms": 12.5, "eval_ms": 40.0, "eval_runs": 4.0}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.single_version
def test_our_engines_end_to_end(tmp_path):
    """Both of our configurations on one real prompt, 8 tokens: rows like hf-speculative bench's, a table, the docs
    section written into a copy of the page. The prompt is MT-bench's first writing question (a one-line request:
    what is checked here does not depend on the prompt, and a summarization prompt's long prefill made up most of the
    test's time, eight times over)."""
    page = tmp_path / "benchmark.md"
    page.write_text(run.DOCS.read_text(encoding="utf-8"), encoding="utf-8")
    before = os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    rows = run.main(["--engines", "hfs-default,hfs-kernel,llamacpp", "--methods", "prompt-lookup",
                     "--categories", "writing", "--prompts-per-category", "1", "--max-new-tokens", "8",
                     "--out", str(tmp_path / "out"), "--write-docs", str(page), "--no-progress"])
    assert os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA") == before
    assert [(r["engine"], r["method"]) for r in rows] == [
        ("hfs-default", "greedy"), ("hfs-default", "prompt-lookup"), ("hfs-kernel", "greedy"),
        ("hfs-kernel", "prompt-lookup")]
    assert all(r["identical_to_greedy"] and r["new_tokens"] == 8 for r in rows)
    assert rows[0]["cpu_layout"] == "none" and rows[2]["cpu_layout"] == "all+kernel"
    assert not rows[0]["sdpa_force_gqa"] and rows[2]["sdpa_force_gqa"]
    assert rows[0]["question_id"] == 81 and "steps" in rows[1]
    lines = (tmp_path / "out" / "smollm2-135m-instruct.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
    text = page.read_text(encoding="utf-8")
    assert f"| hf_speculative {hf_speculative.__version__} defaults (PyTorch fp32) | fp32 (registry) |" in text
    assert "llama.cpp: no --llama-cpp DIR" in text
