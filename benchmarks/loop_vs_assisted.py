"""Chains through hf_speculative's own loop against transformers' assisted loop, same drafter (PromptLookup).

    python benchmarks/loop_vs_assisted.py translation,summarization,qa

The question behind it: should chains move to our loop too? Both routes run the same per-call drafter on
the same prompts (3 per category, 128 new tokens, one thread), interleaved with plain greedy, twice; the
second run is kept. Every output is checked against greedy.
"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
import hf_speculative as hfs
from hf_speculative.bench.spec_bench import DATASET
from hf_speculative.drafters.base import CallContext
from hf_speculative.core.loop import run
from hf_speculative.core.stats import SpeculativeStats
from hf_speculative.core.chains import ChainDrafter
from transformers.generation.stopping_criteria import StoppingCriteriaList, MaxLengthCriteria, EosTokenCriteria

model, tok = hfs.load_model("smollm2-135m-instruct")
hfs.enable(model)
qs = [json.loads(l) for l in open(DATASET)]
cats = sys.argv[1].split(",") if len(sys.argv) > 1 else ["translation", "summarization", "qa"]
prompts = []
for c in cats:
    prompts += [q for q in qs if q["category"] == c][:3]
res = {"greedy": [], "hf-route": [], "our-loop": []}
taus = {"hf-route": [], "our-loop": []}
for q in prompts:
    text = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids
    for rep in range(2):
        t = time.perf_counter(); g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, do_sample=False); tg = time.perf_counter() - t
        t = time.perf_counter(); h = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, do_sample=False, candidate_generator=hfs.PromptLookup()); th = time.perf_counter() - t
        st = hfs.last_stats(model)
        ctx = CallContext(model, model.generation_config, None, None, SpeculativeStats())
        gen = hfs.PromptLookup().open(ctx)
        stop = StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + 128), EosTokenCriteria(model.generation_config.eos_token_id)])
        t = time.perf_counter(); o = run(model, ids, ChainDrafter(gen), stopping_criteria=stop, stats=ctx.stats); to = time.perf_counter() - t
        assert g[0].tolist() == h[0].tolist() == o.sequences[0].tolist(), q["question_id"]
        if rep:
            n = g.shape[1] - ids.shape[1]
            res["greedy"].append(n / tg); res["hf-route"].append(n / th); res["our-loop"].append(n / to)
            taus["hf-route"].append(st.tau); taus["our-loop"].append(o.stats.tau)
    print(q["category"], {k: round(v[-1], 1) for k, v in res.items()}, {k: round(v[-1], 2) for k, v in taus.items()}, flush=True)
print("median tok/s", {k: round(statistics.median(v), 1) for k, v in res.items()})
print("speedup vs greedy (median of ratios)", {k: round(statistics.median([a / b for a, b in zip(v, res["greedy"])]), 3) for k, v in res.items()})
print("tau", {k: round(statistics.mean(v), 2) for k, v in taus.items()})
