"""``python -m tools.corpus build|status|lists|questions|snapshot|restore``: the self-distillation corpus in one command.

    python -m tools.corpus build --target smollm2-135m-instruct --out ~/corpora/smollm2 --answers 20000
    python -m tools.corpus status --out ~/corpora/smollm2
    python -m tools.corpus lists --out lists/ --answers 20000   # then, elsewhere: build ... --lists lists/
    python -m tools.corpus questions --out ~/corpora/smollm2 --to held_out.jsonl --per-category 10
    python -m tools.corpus snapshot --out ~/corpora/smollm2 --to data/snapshots/corpus-smollm2   # restore --from

``build`` writes the prompt list (WordNet, the target's own messages, the team's templates, in the --mix's
proportions, deduplicated, without Spec-Bench's questions, a held-out split by hash), then the target's greedy
answers to it. The same command resumes a stopped run; a larger --answers grows the corpus, keeping every prompt
and answer it has. ``lists`` writes the WordNet and built-in candidates to files for a build on a machine without
Debian's WordNet and fortune files (a lent GPU: ``build --device cuda --lists DIR``). ``questions`` writes the
held-out prompts as a Spec-Bench question file, for the benchmarks' ``--dataset``. ``snapshot`` adds a compressed
part with what a corpus gained to a folder that can be committed, and ``restore`` rebuilds the corpus from it on
another machine (:mod:`tools.corpus.snapshot`). Run it from the repository's
root (``tools`` is not installed with the package).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .mix import DEFAULT_MIX

BUILD = ("Write the prompt list (stage 1), then the target's greedy answers to it (stage 2); the same command "
         "resumes a stopped run, and a larger --answers grows the corpus, keeping every prompt and answer it has.")


def _build_parser(sub) -> None:
    p = sub.add_parser("build", help="build, resume or grow a corpus", description=BUILD)
    p.add_argument("--target", required=True, help="registry name or folder of the target model")
    p.add_argument("--out", type=Path, required=True, help="the corpus's folder, outside the repository")
    p.add_argument("--answers", type=int, default=20_000,
                   help="answers the corpus holds, held-out ones included (default 20000)")
    p.add_argument("--mix", default=DEFAULT_MIX, help="shares of the sources wordnet, magpie (the target's own "
                   "messages) and builtin (the team's templates), normalised to sum to 1 (default %(default)s)")
    p.add_argument("--held-out", type=float, default=0.02,
                   help="fraction of prompts held out, by their text's hash (default 0.02)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the WordNet and built-in lists and of the sampling (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=192, help="tokens per answer at most (default 192)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts (with the chat template) are "
                   "dropped and replaced (default 1024)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts answered together (16: decoding stays within "
                   "the rows hf_speculative's CPU kernel computes; default 16)")
    p.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own choice)")
    p.add_argument("--processes", type=int, default=1, help="one-thread processes sampling the target's own "
                   "messages and answering side by side on the CPU, each with its own copy of the target, every N-th "
                   "batch of messages and chunk of prompts (a small target's batched decoding is bound by each "
                   "core's arithmetic: one process per core; default 1)")
    p.add_argument("--device", default="cpu", help="where the target runs: cpu (default) or cuda; on a GPU give a "
                   "--batch-size and --magpie-batch-size in the hundreds")
    p.add_argument("--answers-dtype", choices=("float32", "bfloat16", "float16", "auto"), help="this run's answers "
                   "in another dtype than the corpus's --dtype (still its setting), once its prompt list is complete: a "
                   "corpus begun in bfloat16 resumed on a CPU that emulates bfloat16 (5-7x slower than float32); "
                   "recorded in the manifest's runs")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "auto"), help="the target's dtype (default: "
                   "float32 on the CPU, the checkpoint's elsewhere)")
    p.add_argument("--sort-window", type=int, default=1024, help="prompts are sorted by length within windows of "
                   "this many before they are batched (0: each chunk of 2048 prompts, or two batches, whole; "
                   "default 1024)")
    p.add_argument("--max-minutes", type=float, help="start no chunk of answers after this many minutes of the build "
                   "(the same command goes on later)")
    p.add_argument("--lists", type=Path, help="read the WordNet and built-in candidates from this folder, written by "
                   "python -m tools.corpus lists (a machine without Debian's WordNet and fortune files)")
    p.add_argument("--cpu-layout", default="auto", help="auto: hfs.optimize_for_cpu(model) (the CPU kernel where it "
                   "runs; the default); or a layout of the CLI's --cpu-layout (none, all, all+kernel, ...)")
    p.add_argument("--prompts-only", action="store_true", help="stop after the prompt list (stage 1)")
    p.add_argument("--wordnet-dir", type=Path, help="folder of WordNet's data.noun (default /usr/share/wordnet)")
    p.add_argument("--fortune-dir", type=Path, help="folder of the fortune files (default /usr/share/games/fortunes)")
    p.add_argument("--magpie-batch-size", type=int, default=64, help="messages sampled together (default 64)")
    p.add_argument("--magpie-max-new-tokens", type=int, default=96, help="longer messages are dropped (default 96)")
    p.add_argument("--magpie-min-words", type=int, default=4, help="shorter messages are dropped (default 4)")
    p.add_argument("--magpie-temperature", type=float, default=1.0, help="the sampling's temperature (default 1.0)")
    p.add_argument("--magpie-top-p", type=float, default=0.95, help="the sampling's top-p (default 0.95)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.corpus", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _build_parser(sub)
    s = sub.add_parser("status", help="answers done of those asked, per source")
    s.add_argument("--out", type=Path, required=True, help="the corpus's folder")
    lists = sub.add_parser("lists", help="the WordNet and built-in candidates of a build, written to files",
                           description="Write the WordNet and built-in candidates a build of --answers would read "
                           "(with a margin for the dropped ones) to OUT/wordnet.jsonl, OUT/builtin.jsonl and "
                           "OUT/lists.json, for `build --lists OUT` on a machine that cannot make them.")
    lists.add_argument("--out", type=Path, required=True, help="the folder to write")
    lists.add_argument("--answers", type=int, default=20_000, help="answers of the build (default 20000)")
    lists.add_argument("--mix", default=DEFAULT_MIX, help="the build's --mix (default %(default)s)")
    lists.add_argument("--seed", type=int, default=0, help="the build's --seed (default 0)")
    lists.add_argument("--wordnet-dir", type=Path, help="folder of WordNet's data.noun (default /usr/share/wordnet)")
    lists.add_argument("--fortune-dir", type=Path, help="folder of the fortune files (default "
                       "/usr/share/games/fortunes)")
    snap = sub.add_parser("snapshot", help="add a compressed part with what the corpus gained to a snapshot folder",
                          description="Add DIR/part-NNNN.jsonl.xz: the rows the corpus's files gained since DIR's "
                          "parts (a rewritten file whole), and its manifest; a folder that can be kept in the "
                          "repository, so that a lost machine does not take the corpus with it (restore).")
    snap.add_argument("--out", type=Path, required=True, help="the corpus's folder")
    snap.add_argument("--to", type=Path, required=True, help="the snapshot folder (DIR)")
    restore = sub.add_parser("restore", help="rebuild a corpus folder from a snapshot folder's parts",
                             description="Write the corpus the parts of --from hold into --out (absent or empty); "
                             "the same build command then resumes it.")
    restore.add_argument("--from", dest="source", type=Path, required=True, help="the snapshot folder")
    restore.add_argument("--out", type=Path, required=True, help="the corpus's folder to write")
    q = sub.add_parser("questions", help="the held-out prompts as a Spec-Bench question file (for --dataset)")
    q.add_argument("--out", type=Path, required=True, help="the corpus's folder")
    q.add_argument("--to", type=Path, required=True, help="the question file to write (JSONL)")
    q.add_argument("--split", default="held_out", help="held_out (default) or train")
    q.add_argument("--per-category", type=int, help="the first N prompts of each category (default all)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from .build import build, status
    from .sources import Exhausted

    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(argv)
    try:
        if args.command == "status":
            print(status(args.out))
            return 0
        if args.command == "snapshot":
            from .snapshot import snapshot

            part = snapshot(args.out, args.to)
            print(f"{part}: {part.stat().st_size / 1e6:.2f} MB" if part else f"{args.to}: nothing new to add")
            return 0
        if args.command == "restore":
            from .snapshot import restore

            done = restore(args.source, args.out)
            print(f"{args.out}: restored from {done['parts']} parts: "
                  + ", ".join(f"{name} {n} rows" for name, n in done["rows"].items()))
            print(status(args.out))
            return 0
        if args.command == "questions":
            from .questions import write_questions

            counts = write_questions(args.out, args.to, args.split, args.per_category)
            print(f"{args.to}: " + ", ".join(f"{name} {n}" for name, n in counts.items())
                  + f" (--dataset {args.to} --categories {','.join(counts)})")
            return 0
        if args.command == "lists":
            from .lists import write_lists

            meta = write_lists(args.out, answers=args.answers, mix=args.mix, seed=args.seed,
                               wordnet_dir=args.wordnet_dir, fortune_dir=args.fortune_dir)
            print(f"{args.out}: " + ", ".join(f"{name} {entry['rows']} candidates" for name, entry in
                                             meta["lists"].items()) + f" (build ... --lists {args.out})")
            return 0
        build(args.target, args.out, answers=args.answers, mix=args.mix, held_out=args.held_out, seed=args.seed,
              max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
              batch_size=args.batch_size, threads=args.threads, cpu_layout=args.cpu_layout,
              prompts_only=args.prompts_only, wordnet_dir=args.wordnet_dir, fortune_dir=args.fortune_dir,
              magpie={"batch_size": args.magpie_batch_size, "max_new_tokens": args.magpie_max_new_tokens,
                      "min_words": args.magpie_min_words, "temperature": args.magpie_temperature,
                      "top_p": args.magpie_top_p}, argv=argv, device=args.device, dtype=args.dtype,
              lists=args.lists, max_minutes=args.max_minutes, sort_window=args.sort_window,
              processes=args.processes, answers_dtype=args.answers_dtype)
    except (OSError, ValueError, Exhausted) as error:
        p.exit(2, f"{p.prog}: error: {error}\n")
    print(status(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
