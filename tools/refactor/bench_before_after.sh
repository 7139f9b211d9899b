#!/bin/bash
# BEFORE: a worktree of the commit to compare with (git worktree add /tmp/wt_before <commit>)
# issue 44 speed before (worktree of 234df72) / after (this stop), back to back; run alone on a quiet machine
set -e
R=/work/main/benchmarks/results
PY=/work/main/.venv/bin/python
COMMON="--model smollm2-135m-instruct --per-category 1 --max-new-tokens 128 --threads 1"
uptime
for side in before after; do
  dir=${BEFORE:-/tmp/wt_before}; [ $side = after ] && dir=/work/main
  rm -f $R/issue44b_chains_$side.jsonl
  (cd $dir && $PY -m hf_speculative bench $COMMON --methods prompt-lookup,eagle,eagle-tree --out $R/issue44b_chains_$side.jsonl) 2>&1 | tail -25
  uptime
done
for side in before after; do
  dir=${BEFORE:-/tmp/wt_before}; [ $side = after ] && dir=/work/main
  rm -f $R/issue44b_batch4_$side.jsonl
  (cd $dir && $PY -m hf_speculative bench $COMMON --methods prompt-lookup,eagle --batch-size 4 --out $R/issue44b_batch4_$side.jsonl) 2>&1 | tail -25
  uptime
done
cd /work/main && $PY benchmarks/loop_vs_assisted.py --per-category 1 --repeats 2 --methods prompt-lookup,eagle --out benchmarks/results/issue44b_loops.json 2>&1 | tail -20
uptime
