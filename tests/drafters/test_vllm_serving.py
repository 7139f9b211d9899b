"""Our ``--format vllm`` exports served by vLLM's CPU build (``-m vllm``, in the venv of ``make install-vllm``; skipped
elsewhere, so ``make test`` never runs them; CI runs them in ``.ci/run`` after the OpenVINO check, beside the test queue).

Every drafter kind we export for vLLM runs there on the registry's smollm2-135m-instruct: EAGLE-3 (the shipped
drafter through ``export-eagle --format vllm``, and one ``train-eagle`` trains in the test), Medusa (``export-medusa
--format vllm``) and DFlash (``export-dflash``). For each, vLLM's speculative greedy decoding gives vLLM's own plain
greedy tokens on every prompt, and vLLM's mean acceptance length (its spec-decode counters: ``1 + accepted / drafts``)
is within 20% of ours with the same drafter at the same fixed chain (``adaptive=False``: every step drafts
``num_tokens``). DFlash runs at ``block_size - 1`` tokens on both sides: vLLM's window is the anchor and
``num_speculative_tokens`` masks, ours the whole block, and with bidirectional layers they agree only at the full
block. A negative control: our own DFlash folder (``draft_vocab.safetensors`` beside the weights) fails vLLM's load,
which is why ``export-dflash`` exists. MTP has no export (vLLM runs the MTP layers of the target's own checkpoint, and
the registry's models have none).

vLLM runs in one subprocess (``benchmarks/peers/vllm_worker.py run``: one ``LLM`` at a time, in that process) and our
side in this one. The config we write by hand is checked against ``speculators``, the library that defines the format.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hf_speculative.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "benchmarks" / "peers" / "vllm_worker.py"
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
MODEL = "smollm2-135m-instruct"
PROMPTS = ["Explain photosynthesis in two sentences.", "Write a short story about a lighthouse keeper.",
           "Give three tips for learning a new language."]
NEW_TOKENS = 32
CHAIN = 4  # EAGLE-3 and Medusa: the fixed chain on both sides
TOLERANCE = 0.20
KINDS = ["eagle3", "medusa", "dflash", "eagle3-trained"]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not _importable("vllm"), reason="needs vLLM's CPU build, in a venv of its own (make "
                       "install-vllm; .venv-vllm/bin/python -m pytest -m vllm tests/drafters/test_vllm_serving.py)"),
]


def cli(*args) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    assert result.exit_code == 0, result.output + repr(result.exception)


def train_tiny_eagle(out: Path) -> Path:
    """A drafter ``train-eagle`` trains in seconds on a dozen lines (as docs/recipes/export-eagle.md's)."""
    corpus = out / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Item {i}: the order of {i + 2} boxes ships on day {i % 7} from "
                                                   "the north depot."}) + "\n" for i in range(12)))
    command = [sys.executable, "-m", "hf_speculative", "train-eagle", "--target", MODEL, "--data", str(corpus),
               "--out", str(out / "trained"), "--eagle3", "--draft-vocab-size", "256", "--epochs", "1",
               "--grad-accum", "1", "--eval-every", "1000", "--val-prompts", "1", "--threads", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "trained"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The target's registry folder and every export vLLM serves, written by the command line."""
    from hf_speculative.drafters.dflash.drafter import PRETRAINED_DIR as DFLASH_DIR
    from hf_speculative.registry.models import resolve

    out = tmp_path_factory.mktemp("vllm")
    cli("export-eagle", MODEL, "--format", "vllm", "--out", out / "eagle3")
    cli("export-medusa", MODEL, "--format", "vllm", "--target", MODEL, "--out", out / "medusa")
    cli("export-dflash", MODEL, "--out", out / "dflash")
    cli("export-eagle", train_tiny_eagle(out), "--format", "vllm", "--out", out / "eagle3-trained")
    ours_dflash = out / "dflash-ours"  # our own folder, as train-dflash writes it: vLLM cannot load it
    ours_dflash.mkdir()
    for name in ("config.json", "model.safetensors", "draft_vocab.safetensors"):
        (ours_dflash / name).write_bytes((DFLASH_DIR / MODEL / name).read_bytes())
    return {"target": Path(resolve(MODEL)), "trained": out / "trained", **{p.name: p for p in out.iterdir()}}


def vllm_runs(folders: dict) -> dict:
    def spec(method: str, folder: str, tokens: int) -> dict:
        return {"method": method, "model": str(folders[folder]), "num_speculative_tokens": tokens}

    return {"plain": None, "eagle3": spec("eagle3", "eagle3", CHAIN), "medusa": spec("medusa", "medusa", CHAIN),
            "dflash": spec("dflash", "dflash", dflash_block() - 1),
            "eagle3-trained": spec("eagle3", "eagle3-trained", CHAIN),
            "dflash-ours": spec("dflash", "dflash-ours", dflash_block() - 1)}


def dflash_block() -> int:
    from hf_speculative.drafters.dflash.drafter import PRETRAINED_DIR

    return json.loads((PRETRAINED_DIR / MODEL / "config.json").read_text())["block_size"]


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    from hf_speculative.registry.models import resolve
    from hf_speculative.tooling.prompting import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(resolve(MODEL))
    return [encode_prompt(tokenizer, p, True)[0].tolist() for p in PROMPTS]


@pytest.fixture(scope="module")
def worker(folders, prompts, tmp_path_factory):
    """The vLLM worker process, started on every run (``served`` waits for it, ``ours`` runs meanwhile)."""
    job = tmp_path_factory.mktemp("job") / "requests.json"
    runs = [{"name": name, "speculative_config": spec} for name, spec in vllm_runs(folders).items()]
    job.write_text(json.dumps({"prompts": prompts, "max_new_tokens": NEW_TOKENS, "runs": runs}))
    command = [sys.executable, str(WORKER), "run", "--model", str(folders["target"]), "--requests", str(job),
               "--threads", "1", "--max-model-len", "1024"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield process
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def served(worker, mine):
    """vLLM's outputs and counters of every run, from the one worker process (after our side has run)."""
    out, err = worker.communicate(timeout=1500)
    assert worker.returncode == 0 and out.strip(), err[-5000:]
    reply = json.loads(out.strip().splitlines()[-1])
    # where the check's minutes go (CI's log shows it: .ci/run passes -rP): each engine's start and its requests
    print(f"vLLM worker: {reply['seconds']} s; per run (start, requests): "
          + ", ".join(f"{name} ({run.get('load_seconds')}, {run.get('generate_seconds')})"
                      for name, run in reply["runs"].items()))
    return reply["runs"]


def mean_acceptance_length(metrics: list[dict]) -> float:
    drafts = sum(m["drafts"] for m in metrics)
    return 1 + sum(m["accepted_tokens"] for m in metrics) / drafts


def ours(kind: str, model, folders: dict, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    """Our outputs and mean acceptance length (``1 + accepted / verifications of a draft``, as vLLM counts) with the
    same drafter at the same fixed chain."""
    import hf_speculative as hfs

    make = {
        "eagle3": lambda: hfs.Eagle.from_pretrained(MODEL, target=model, num_tokens=CHAIN, adaptive=False),
        "eagle3-trained": lambda: hfs.Eagle.from_pretrained(str(folders["trained"]), target=model, num_tokens=CHAIN,
                                                            adaptive=False),
        "medusa": lambda: hfs.Medusa.from_pretrained(MODEL, target=model, num_tokens=CHAIN, adaptive=False),
        "dflash": lambda: hfs.DFlash.from_pretrained(MODEL, target=model, num_tokens=dflash_block() - 1,
                                                     adaptive=False),
    }[kind]
    strategy = make()
    outputs, accepted, drafts = [], 0, 0
    for ids in prompts:
        x = torch.tensor([ids])
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             do_sample=False, candidate_generator=strategy)
        outputs.append(out[0, x.shape[1]:].tolist())
        steps = hfs.last_stats(model).steps()
        kept = [a for a, d in zip(steps["accepted"], steps["drafted"]) if d > 0]
        accepted, drafts = accepted + sum(kept), drafts + len(kept)
    return outputs, 1 + accepted / drafts


@pytest.fixture(scope="module")
def mine(worker, folders, prompts):
    """Our side of every kind, ``{kind: (outputs, mean acceptance length)}``, computed while vLLM's worker runs."""
    import hf_speculative as hfs

    started = time.perf_counter()
    model, _ = hfs.load_model(MODEL)
    hfs.enable(model)
    done = {kind: ours(kind, model, folders, prompts) for kind in KINDS}
    print(f"our side: {time.perf_counter() - started:.1f} s for {len(KINDS)} drafters")
    return done


@pytest.mark.parametrize("kind", KINDS)
def test_vllm_speculative_greedy_is_its_plain_greedy(served, kind):
    assert "error" not in served[kind], served[kind].get("error")
    plain = served["plain"]["outputs"]
    assert served[kind]["outputs"] == plain
    assert all(len(o) > 8 for o in plain)  # real answers, not an immediate end of turn
    assert sum(m["draft_tokens"] for m in served[kind]["metrics"]) > 0  # it speculated


@pytest.mark.parametrize("kind", KINDS)
def test_vllm_acceptance_is_ours(served, mine, kind):
    theirs = mean_acceptance_length(served[kind]["metrics"])
    outputs, length = mine[kind]
    print(f"{kind}: mean acceptance length vLLM {theirs:.3f}, hf_speculative {length:.3f}")
    assert outputs == served["plain"]["outputs"]  # the same greedy text on both engines: comparable counts
    assert abs(theirs - length) <= TOLERANCE * length, (theirs, length)
    if kind in ("eagle3", "dflash"):  # trained drafters that draft well: a wrong weight mapping would collapse this
        assert length > 1.15


def test_our_dflash_folder_is_what_vllm_cannot_load(served):
    """The negative control of export-dflash: the folder train-dflash writes, draft_vocab.safetensors included."""
    assert "draft_id_to_target_id" in served["dflash-ours"].get("error", ""), served["dflash-ours"]


# -- the format, through the library that defines it --------------------------------------------------------
def test_eagle3_export_is_speculators_eagle3(folders):
    """speculators parses our hand-written config as its Eagle3SpeculatorConfig with the values we wrote, and its
    Eagle3DraftModel has exactly our weights (less the target's embedding and head, which it does not save)."""
    from safetensors import safe_open
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel

    for name in ("eagle3", "eagle3-trained"):
        written = json.loads((folders[name] / "config.json").read_text())
        parsed = SpeculatorModelConfig.from_dict(dict(written))
        assert isinstance(parsed, Eagle3SpeculatorConfig)
        as_dict = parsed.to_dict()
        # its own fields (less the two we do not write) and the speculators ones, not transformers' generic ones
        fields = (set(Eagle3SpeculatorConfig.model_fields) - set(SpeculatorModelConfig.model_fields)
                  - {"transformer_layer_config", "embed_requires_grad"}) | {"speculators_model_type",
                                                                             "speculators_config", "architectures"}
        assert {k: as_dict[k] for k in fields} == {k: written[k] for k in fields}
        layer = parsed.transformer_layer_config
        assert type(layer).__name__ == "LlamaConfig"
        assert {k: getattr(layer, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps")} == {
            k: written["transformer_layer_config"][k] for k in ("hidden_size", "num_attention_heads",
                                                                  "num_key_value_heads", "head_dim",
                                                                  "intermediate_size", "vocab_size", "rms_norm_eps")}
        with torch.device("meta"):
            theirs = {k: tuple(v.shape) for k, v in Eagle3DraftModel(parsed).state_dict().items()}
        with safe_open(str(folders[name] / "model.safetensors"), "pt") as f:
            mine = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        unsaved = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
        assert {k: v for k, v in theirs.items() if k not in unsaved} == mine


def test_architectures_we_refuse_lack_vllms_hidden_state_outputs():
    """vllm_support.NO_AUX_HIDDEN_STATES against vLLM itself: each is a vLLM architecture whose class does not
    implement SupportsEagle3; the registry's Llama and Qwen2 do."""
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import _VLLM_MODELS, ModelRegistry

    from hf_speculative.drafters.vllm_support import NO_AUX_HIDDEN_STATES

    assert NO_AUX_HIDDEN_STATES <= set(_VLLM_MODELS)
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
        assert supports_eagle3(ModelRegistry._try_load_model_cls(arch)), arch
    classes = {a: ModelRegistry._try_load_model_cls(a) for a in sorted(NO_AUX_HIDDEN_STATES)}
    assert not [a for a, c in classes.items() if c is None or supports_eagle3(c)]
