"""Drafting and verification milliseconds per step of the drafter kinds transformers 5.x ships, in hf_speculative's
loop and in transformers' own assisted loop, on the same random weights (issue 46).

    python benchmarks/new_drafters_ms.py [--kinds mtp,dflash,gemma4] [--new-tokens 48] [--runs 3] [--out F.jsonl]

Random weights accept nothing, and a drafter that is always rejected drafts differently in the two loops (ours shrinks
its chain after a rejection, transformers' generators draft a fixed count). So every pair runs with its target's
lm_head zeroed (and the drafter's where it has its own): the target always writes token 0 and the drafter always
drafts it, every draft is kept, and both loops draft the same number of tokens per step: MTP one per MTP layer
(transformers' rule; ours with ``num_tokens`` = the layers), DFlash ``block_size - 1``, the Gemma-4 assistant
``num_assistant_tokens``. The figures are medians over the steps of ``--runs`` calls (after one warm-up), the calls
of both loops and plain greedy interleaved; our loop's per-step times come from ``hfs.last_stats(model).steps()``,
transformers' from timing its generator's ``get_candidates`` and the target's forwards (hooks). The shapes are
small (hidden 256) so that the CPU runs them in seconds: ratios between the loops, not absolute speeds of real
models. Run it alone on a quiet machine (check ``uptime``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HIDDEN, LAYERS, VOCAB, PROMPT = 256, 4, 4096, 64


def _zero_head(model) -> None:
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()


# -- the pairs ---------------------------------------------------------------------------------------------------
def mtp_pair(folder: Path):
    """A GLM-4.5-style (glm4_moe) target with one MTP layer saved in the checkpoint layout transformers reads."""
    from safetensors.torch import load_file, save_file
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    def config(layers):
        return Glm4MoeConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
                             num_hidden_layers=layers,
                             num_attention_heads=8, num_key_value_heads=4, head_dim=32, moe_intermediate_size=HIDDEN,
                             n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                             num_mtp_layers=1, max_position_embeddings=1024, eos_token_id=2, pad_token_id=0,
                             bos_token_id=3, tie_word_embeddings=False)

    torch.manual_seed(0)
    Glm4MoeForCausalLM(config(LAYERS + 1)).save_pretrained(folder)  # its layer LAYERS becomes the MTP block
    weights = load_file(folder / "model.safetensors")
    prefix = f"model.layers.{LAYERS}."
    for name in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"{prefix}{name}.weight"] = torch.ones(HIDDEN)
    weights[prefix + "eh_proj.weight"] = 0.02 * torch.randn(HIDDEN, 2 * HIDDEN)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config(LAYERS).save_pretrained(folder)
    target = Glm4MoeForCausalLM.from_pretrained(folder).eval()
    # transformers' MtpModel.from_pretrained finds MTP keys by the class's hard-coded layer number (46/92 for GLM):
    # name this depth's (an instance attribute: the class is left alone)
    target._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS}\..*"]
    _zero_head(target)

    def ours():
        import hf_speculative as hfs

        return {"candidate_generator": hfs.MTP.from_pretrained(target, num_tokens=1, confidence_threshold=0.0,
                                                               adaptive=False)}

    return target, ours, lambda: {"use_mtp": True}, "MTPCandidateGenerator"


def dflash_pair(folder: Path):
    """A Llama target and a random 1-layer DFlash network (block 8) shaped for it; transformers runs the same weights
    as its MuseGlimmerAssistantModel."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    from hf_speculative.drafters.dflash.checkpoints import to_transformers
    from hf_speculative.drafters.dflash.drafter import random_network

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
                                          num_hidden_layers=LAYERS, num_attention_heads=8, num_key_value_heads=4,
                                          max_position_embeddings=1024, eos_token_id=2, pad_token_id=0,
                                          bos_token_id=3, tie_word_embeddings=False)).eval()
    _zero_head(target)
    net = random_network(target, num_hidden_layers=1, block_size=8, scale=0.02)
    fields, state = to_transformers(net)
    assistant = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(**fields, bos_token_id=None, eos_token_id=None,
                                                                     pad_token_id=None)).eval()
    assistant.load_state_dict(state, strict=True)

    def ours():
        import hf_speculative as hfs

        return {"candidate_generator": hfs.DFlash(net, num_tokens=7, confidence_threshold=0.0, adaptive=False)}

    return target, ours, lambda: {"assistant_model": assistant, "speculation_type": "dflash"}, \
        "DFlashTokenCandidateGenerator"


def gemma4_pair(folder: Path):
    """A 4-layer Gemma-4 target and a 2-layer assistant (hf_speculative's tiny pair, at hidden 256)."""
    import copy

    from hf_speculative.drafters.assistant.tiny import tiny_assistant, tiny_target

    target = tiny_target(vocab_size=VOCAB, hidden_size=HIDDEN, layers=LAYERS, sliding_window=512, eos_token_id=2,
                         max_position_embeddings=1024)
    _zero_head(target)
    assistant = tiny_assistant(target, hidden_size=HIDDEN, layers=2, num_tokens=4)
    _zero_head(assistant)
    theirs = copy.deepcopy(assistant)

    def ours():
        import hf_speculative as hfs

        return {"candidate_generator": hfs.Assistant(assistant, num_tokens=4, confidence_threshold=0.0, adaptive=False)}

    return target, ours, lambda: {"assistant_model": theirs}, "SinglePositionMultiTokenCandidateGenerator"


PAIRS = {"mtp": mtp_pair, "dflash": dflash_pair, "gemma4": gemma4_pair}


# -- timing transformers' loop -------------------------------------------------------------------------------------
class TransformersSteps:
    """Per-step seconds of transformers' assisted loop: its generator's ``get_candidates`` and the target's forwards
    (the first forward, the prefill, is left out as in our stats)."""

    def __init__(self, target, generator_name: str):
        from transformers.generation import candidate_generator

        self.cls = getattr(candidate_generator, generator_name)
        self.original = self.cls.get_candidates
        self.draft_s: list[float] = []
        self.verify_s: list[float] = []
        steps = self

        def timed(self, *args, **kwargs):
            start = time.perf_counter()
            out = steps.original(self, *args, **kwargs)
            steps.draft_s.append(time.perf_counter() - start)
            return out

        self.cls.get_candidates = timed  # this script's instrumentation only: restored by close()
        self._start = None
        self.handles = [target.register_forward_pre_hook(self._pre), target.register_forward_hook(self._post)]

    def _pre(self, module, args):
        self._start = time.perf_counter()

    def _post(self, module, args, output):
        self.verify_s.append(time.perf_counter() - self._start)

    def close(self) -> None:
        self.cls.get_candidates = self.original
        for handle in self.handles:
            handle.remove()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", default="mtp,dflash,gemma4")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import hf_speculative as hfs

    rows = []
    for kind in args.kinds.split(","):
        with tempfile.TemporaryDirectory() as folder:
            target, ours, theirs, generator_name = PAIRS[kind](Path(folder))
            model = hfs.enable(target)
            torch.manual_seed(1)
            ids = torch.randint(4, VOCAB, (1, PROMPT))
            base = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                        do_sample=False)
            expected = type(target).generate(target, **base)
            samples = {"ours_draft": [], "ours_verify": [], "ours_tokens": [], "tf_draft": [], "tf_verify": [],
                       "ours_s": [], "tf_s": [], "greedy_s": []}
            for run in range(args.runs + 1):
                with torch.inference_mode():
                    start = time.perf_counter()
                    type(target).generate(target, **base)
                    greedy_s = time.perf_counter() - start
                    start = time.perf_counter()
                    out = model.generate(**base, **ours())
                    ours_s = time.perf_counter() - start
                    steps = hfs.last_stats(model).steps()
                    recorder = TransformersSteps(target, generator_name)
                    try:
                        start = time.perf_counter()
                        out_tf = type(target).generate(target, **base, **theirs())
                        tf_s = time.perf_counter() - start
                    finally:
                        recorder.close()
                assert out.tolist() == expected.tolist() == out_tf.tolist(), kind
                if run == 0:
                    continue  # warm-up
                drafted = [(d, v, n) for d, v, n in zip(steps["draft_s"], steps["verify_s"], steps["drafted"]) if n]
                samples["ours_draft"] += [d for d, _, _ in drafted]
                samples["ours_verify"] += [v for _, v, _ in drafted]
                samples["ours_tokens"] += [n for _, _, n in drafted]
                samples["tf_draft"] += recorder.draft_s[1:]  # the first call returns the prompt unchanged (no draft)
                samples["tf_verify"] += recorder.verify_s[1:]  # the prefill left out
                samples["ours_s"].append(ours_s)
                samples["tf_s"].append(tf_s)
                samples["greedy_s"].append(greedy_s)
            med = {k: statistics.median(v) for k, v in samples.items() if v}
            row = {"kind": kind, "new_tokens": args.new_tokens, "runs": args.runs,
                   "ours_draft_ms": 1e3 * med["ours_draft"], "ours_verify_ms": 1e3 * med["ours_verify"],
                   "ours_drafted_per_step": med["ours_tokens"],
                   "transformers_draft_ms": 1e3 * med["tf_draft"], "transformers_verify_ms": 1e3 * med["tf_verify"],
                   "ours_vs_greedy": med["greedy_s"] / med["ours_s"],
                   "transformers_vs_greedy": med["greedy_s"] / med["tf_s"],
                   "ours_vs_transformers": med["tf_s"] / med["ours_s"]}
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            hfs.disable(target)
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
