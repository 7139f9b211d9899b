"""The SDPA attention implementations our masked forwards run on, and grouped-query SDPA around them on a CPU.

A draft tree's verification adds a 4-D mask; the implementations that take one as it is are transformers' ``"sdpa"``
and :data:`CPU_ATTENTION`, hf_speculative's fp32 attention for CPU models (``hf_speculative/cpu/attention.py``
registers it under that name in transformers' interfaces; masks, trees and the switch below treat it as ``"sdpa"``).

transformers' SDPA path repeats the keys and values of a grouped-query model (``repeat_kv``) for every head whenever
a forward has a mask (several tokens after a cache), unless ``TRANSFORMERS_SDPA_FORCE_GQA=1`` (read from the
environment by every SDPA call, in the 5.x versions that have it: ``compat.reads_force_gqa``); then it passes
``enable_gqa=True`` to torch (2.5+). On a CPU that copy is ~14% of a verification forward of SmolLM2 with the kernel
layout (k = 2..11, benchmarks in docs/how-it-works.md); the outputs are bitwise the same either way. On CUDA a masked
GQA call would fall back to SDPA's math kernel, so it stays off there. The variable is the only switch transformers
reads (no argument, config field or module attribute reaches that decision), so :func:`grouped_query_sdpa` sets it
around our own forwards only, counted, and leaves a value the user set alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

from .. import compat

# transformers' SDPA attention on tensors widened to fp32, for 16-bit models on a CPU (hf_speculative/cpu/attention.py,
# registered in transformers' interfaces under this name): masks, trees and the GQA switch as "sdpa"
CPU_ATTENTION = "hfs_cpu_sdpa"
SDPA_NAMES = ("sdpa", CPU_ATTENTION)
# on such a model (bf16 on the CPU kernel), a forward of up to this many tokens computes each of its rows as a one-token
# forward does (products and attention), so verification keeps to it (core/verify.py splits a first forward)
CPU_ROWWISE_TOKENS = 64
_GQA_LOCK = threading.Lock()
_GQA_USERS = 0


@contextlib.contextmanager
def grouped_query_sdpa(model: Any, tokens: int) -> Iterator[None]:
    """Around one of our target forwards over ``tokens`` tokens: on a CPU SDPA model, transformers' grouped-query
    SDPA instead of its ``repeat_kv`` copies. A value the user set (``0`` or ``1``) is left as it is; concurrent
    calls share one setting, restored when the last one ends."""
    global _GQA_USERS
    config = getattr(model, "config", None)
    wanted = (tokens > 1 and compat.reads_force_gqa() and getattr(config, "_attn_implementation", None) in SDPA_NAMES
              and getattr(getattr(model, "device", None), "type", "cpu") == "cpu")
    if not wanted:
        yield
        return
    with _GQA_LOCK:
        if _GQA_USERS == 0 and compat.SDPA_FORCE_GQA in os.environ:
            wanted = False  # the user's own choice
        else:
            _GQA_USERS += 1
            os.environ[compat.SDPA_FORCE_GQA] = "1"
    try:
        yield
    finally:
        if wanted:
            with _GQA_LOCK:
                _GQA_USERS -= 1
                if _GQA_USERS == 0:
                    os.environ.pop(compat.SDPA_FORCE_GQA, None)
