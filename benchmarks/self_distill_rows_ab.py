"""A/B: transformers' batched greedy generate() against training/batch_greedy.greedy_rows (each row dropped at its end):
2 batches of 16 prompts (`python -m tools.prompts wordnet 32 --seed 7 --out wn32.jsonl`), 192 new tokens, one thread,
the two alternating over 2 rounds; prints both times, their ratio and how many answers are identical.

    python benchmarks/self_distill_rows_ab.py wn32.jsonl
"""
import json, sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
torch.set_num_threads(1)
from tools.corpus.answers import load_target
from hf_speculative.training.selfdistill import chat_text
from hf_speculative.training.batch_greedy import greedy_rows
from hf_speculative import compat
m, tok = load_target("smollm2-135m-instruct", threads=1)
rows = [json.loads(l) for l in open(sys.argv[1] if len(sys.argv) > 1 else "wn32.jsonl")]
eos = set(compat.eos_token_ids(m.generation_config))
pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
enc = [tok(chat_text(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
enc.sort(key=len)
batches = []
for b in range(0, len(enc), 16):
    part = enc[b:b+16]; w = max(map(len, part))
    ids = torch.full((len(part), w), pad); mask = torch.zeros_like(ids)
    for i, e in enumerate(part):
        ids[i, w-len(e):] = torch.tensor(e); mask[i, w-len(e):] = 1
    batches.append((ids, mask))
def gen(ids, mask):
    out = m.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=192, pad_token_id=pad)
    res = []
    for s in out[:, ids.shape[1]:].tolist():
        e = next((j for j, t in enumerate(s) if t in eos), len(s) - 1); res.append(s[:e+1])
    return res
def rows_(ids, mask):
    return greedy_rows(m, ids, mask, max_new_tokens=192, eos_ids=eos)
times = {"generate": [], "greedy_rows": []}
outs = {}
for rnd in range(2):
    for name, fn in (("generate", gen), ("greedy_rows", rows_)) if rnd % 2 == 0 else (("greedy_rows", rows_), ("generate", gen)):
        t0 = time.perf_counter(); o = [fn(i, k) for i, k in batches]; times[name].append(time.perf_counter() - t0)
        outs.setdefault(name, o)
        print(name, round(times[name][-1], 2), flush=True)
same = sum(a == b for x, y in zip(outs["generate"], outs["greedy_rows"]) for a, b in zip(x, y))
lens = [len(r) for b in outs["generate"] for r in b]
print("identical rows", same, "/", len(lens), "mean answer", sum(lens)/len(lens), "at limit", sum(l == 192 for l in lens))
g, r = sorted(times["generate"]), sorted(times["greedy_rows"])
print("median generate", sum(g)/2, "greedy_rows", sum(r)/2, "ratio", (sum(g)/2)/(sum(r)/2))
