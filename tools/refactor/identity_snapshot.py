"""Every registered method's output on Spec-Bench prompts, as token ids: run before and after a refactor, diff.

    python tools/refactor/identity_snapshot.py OUT.jsonl [--per-category 10] [--new-tokens 32]

Greedy for every hf_speculative method (draft-model drafts with a copy of the target: the default model has no
smaller sibling), and seeded sampling (T=0.7, --seeds) for the methods that sample. Not a timing: it may run
beside other work. Compare two files with ``--diff A B``; ``--methods none`` records only the plain runs (greedy and
seeded sampling without a drafter), the cheap "before" side when the "after" file shows every method equal to them.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?")
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--methods", default="")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--diff", nargs=2)
    parser.add_argument("--reverse", action="store_true",
                        help="run the questions last first (a second process beside a first one, on another core)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the questions OUT holds in full (each ends with a printed id: its last run, the "
                             "plain seeded one, is written) and run the rest; a question cut short is run again")
    args = parser.parse_args()
    if args.diff:
        sys.exit(diff(*args.diff))
    torch.set_num_threads(1)
    import hf_speculative as hfs
    from hf_speculative.bench.spec_bench import DATASET
    try:  # the layout since issue 44, else the one before (the snapshot runs on both sides of the move)
        from hf_speculative.tooling.methods import available_methods, get_method, pad_token_id
        from hf_speculative.tooling.prompting import encode_prompt
    except ImportError:
        from hf_speculative.methods import available_methods, get_method, pad_token_id
        from hf_speculative.prompting import encode_prompt

    model, tok = hfs.load_model("smollm2-135m-instruct")
    hfs.enable(model)
    draft = copy.deepcopy(model)
    hfs.disable(draft)
    questions = [json.loads(line) for line in open(DATASET)]
    cats: dict[str, list] = {}
    for q in questions:
        cat = "mt-bench" if q["category"] in {"writing", "roleplay", "reasoning", "math", "coding", "extraction",
                                               "stem", "humanities"} else q["category"]
        cats.setdefault(cat, []).append(q)
    prompts = [q for qs in cats.values() for q in qs[: args.per_category]]
    if args.reverse:
        prompts.reverse()
    names = [m for m in available_methods() if get_method(m).kind == "hfs"]
    if args.methods:
        names = [m for m in names if m in args.methods.split(",")]
    pad = pad_token_id(model, tok)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    done = finished_questions(args.out, seeds) if args.resume else set()
    with open(args.out, "a" if args.resume else "w") as out:
        for q in prompts:
            if q["question_id"] in done:
                continue
            ids = encode_prompt(tok, q["turns"][0])
            base = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens, pad_token_id=pad)
            runs = [("greedy", None, {"do_sample": False, "candidate_generator": None})]
            for name in names:
                options = {"draft_model": draft} if get_method(name).needs_draft_model else {}
                if name == "layer-skip":
                    options["skip"] = "10,20"
                extra = get_method(name).build(model, tok, options)
                runs.append((name, None, {"do_sample": False, **extra}))
                for seed in seeds:
                    runs.append((name, seed, {"do_sample": True, "temperature": 0.7, "sampling_seed": seed, **extra}))
            for seed in seeds:
                runs.append(("greedy", seed, {"do_sample": True, "temperature": 0.7, "sampling_seed": seed,
                                              "candidate_generator": None}))
            for name, seed, kwargs in runs:
                with torch.inference_mode():
                    try:
                        ids_out = model.generate(ids, **base, **kwargs)[0, ids.shape[1]:].tolist()
                    except Exception as error:  # noqa: BLE001 - recorded, compared like an output
                        ids_out = f"{type(error).__name__}: {error}"[:300]
                stats = hfs.last_stats(model) if name != "greedy" else None
                out.write(json.dumps({"q": q["question_id"], "method": name, "seed": seed, "ids": ids_out,
                                      "forwards": None if stats is None else stats.target_forwards}) + "\n")
                out.flush()
            print(q["question_id"], flush=True)


def finished_questions(path: str, seeds: list[int]) -> set:
    """The questions ``path`` holds in full (their last run, the plain seeded one of the last seed, written), after
    cutting off the runs of a question the previous run did not finish."""
    import os

    if not os.path.exists(path):
        return set()
    rows = [json.loads(line) for line in open(path) if line.endswith("\n")]
    last_seed = seeds[-1] if seeds else None
    done = {r["q"] for r in rows if r["method"] == "greedy" and r["seed"] == last_seed}
    kept = [r for r in rows if r["q"] in done]
    with open(path, "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in kept)
    return done


def diff(a: str, b: str) -> int:
    def load(path):
        return {(r["q"], r["method"], r["seed"]): r["ids"] for r in map(json.loads, open(path))}

    left, right = load(a), load(b)
    common = left.keys() & right.keys()
    bad = [k for k in sorted(common, key=str) if left[k] != right[k]]
    greedy = {k[0]: v for k, v in left.items() if k[1] == "greedy" and k[2] is None}
    wrong = [k for k in sorted(right, key=str) if k[2] is None and right[k] != greedy.get(k[0], right[k])]
    # Seeded sampling: one seed gives one text whatever the drafter does, so every method's sampled run of B equals
    # B's plain sampled run with that seed (a refactor's "after" file is checked against its own plain runs; the
    # plain runs against A's).
    plain = {(k[0], k[2]): v for k, v in right.items() if k[1] == "greedy" and k[2] is not None}
    unseeded = [k for k in sorted(right, key=str) if k[2] is not None and right[k] != plain.get((k[0], k[2]), right[k])]
    print(f"{len(common)} runs in both; {len(bad)} differ; {len(wrong)} greedy runs of B differ from greedy; "
          f"{len(unseeded)} sampled runs of B differ from B's plain sampling with their seed; "
          f"only in A: {len(left.keys() - right.keys())}, only in B: {len(right.keys() - left.keys())}")
    for k in bad[:20]:
        print("differs:", k)
    for k in wrong[:20]:
        print("not greedy:", k)
    for k in unseeded[:20]:
        print("not plain seeded sampling:", k)
    return 1 if bad or wrong or unseeded else 0


if __name__ == "__main__":
    main()
