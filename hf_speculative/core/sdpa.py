"""The SDPA attention implementations our masked forwards run on.

A draft tree's verification adds a 4-D mask; the implementations that take one as it is are transformers' ``"sdpa"``
and :data:`CPU_ATTENTION`, hf_speculative's fp32 attention for CPU models (``hf_speculative/cpu/attention.py``
registers it under that name in transformers' interfaces; masks and trees treat it as ``"sdpa"``).

Until issue 68 our masked forwards on a CPU set transformers' ``TRANSFORMERS_SDPA_FORCE_GQA=1`` around themselves
(grouped-query SDPA instead of ``repeat_kv`` copies): a process-wide variable written per call, which every thread's
forwards read. It no longer is: end to end it changed nothing measurable (prompt lookup on SmolLM2, 4 Spec-Bench
prompts x 96 tokens x 3, interleaved, alone: 1.00x as loaded and 1.00x after ``optimize_for_cpu``, whose own attention
groups queries itself; ``benchmarks/gqa_switch_ab.py``, ``benchmarks/results/issue68_gqa_switch_ab.json``), and a
forward on 2 / 6 / 11 tokens at a 512-token context gains 7% / 4% / 0% from it on the stock layout, 3% / 3% / 0% on
the kernel's (``benchmarks/verify_costs.py``). A user who wants it sets the variable (the CLI's ``--sdpa-gqa``).
"""

from __future__ import annotations

# transformers' SDPA attention on tensors widened to fp32, for 16-bit models on a CPU (hf_speculative/cpu/attention.py,
# registered in transformers' interfaces under this name): masks and trees as "sdpa"
CPU_ATTENTION = "hfs_cpu_sdpa"
SDPA_NAMES = ("sdpa", CPU_ATTENTION)
# on such a model (bf16 on the CPU kernel), a forward of up to this many tokens computes each of its rows as a one-token
# forward does (products and attention), so verification keeps to it (core/verify.py splits a first forward)
CPU_ROWWISE_TOKENS = 64
