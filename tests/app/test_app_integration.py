"""The app on the real default model (smollm2-135m-instruct from the offline registry), via its API."""

from __future__ import annotations

import pytest
import torch

from hf_speculative.app.examples import EXAMPLES
from tests.app.conftest import compare_args
from tests.conftest import launch_local

pytestmark = pytest.mark.integration


def test_default_model_prompt_lookup_matches_greedy_with_consistent_figures():
    from gradio_client import Client

    import hf_speculative as hfs
    from hf_speculative.app.cache import ModelCache
    from hf_speculative.app.ui import build_app
    from hf_speculative.bench.runner import encode_prompt

    from hf_speculative.core import policy

    cache = ModelCache(device=torch.device("cpu"))
    # fixed (GPU-like) costs: the adaptive prompt lookup drafts whatever the load of the machine
    policy.verify_costs_for(cache.get(hfs.models.DEFAULT_MODEL).model, 32).fix([1.0 + 0.01 * k for k in range(33)])
    demo = build_app(cache)
    url, _ = launch_local(demo)
    try:
        out = Client(url, verbose=False).predict(
            *compare_args(EXAMPLES["summarization"], hfs.models.DEFAULT_MODEL, ["prompt-lookup"], max_new_tokens=48),
            api_name="/compare")
    finally:
        demo.close()
    greedy, lookup = out[-1]["methods"]
    assert out[0].startswith("Done: 2/2") and greedy["new_tokens"] == 48
    loaded = cache.get(hfs.models.DEFAULT_MODEL)
    ids = encode_prompt(loaded.tokenizer, EXAMPLES["summarization"])
    with torch.inference_mode():
        reference = type(loaded.model).generate(loaded.model, ids, attention_mask=torch.ones_like(ids),
                                                max_new_tokens=48, do_sample=False)
    assert greedy["output_ids"] == reference[0, ids.shape[1]:].tolist()
    assert lookup["output_ids"] == greedy["output_ids"] and lookup["identical_to_baseline"] is True
    assert lookup["text"] == loaded.tokenizer.decode(reference[0, ids.shape[1]:], skip_special_tokens=True)
    assert lookup["tau"] == pytest.approx(48 / lookup["target_forwards"]) and lookup["tau"] > 1.2
    stats = lookup["hfs_stats"]
    assert stats["target_forwards"] == lookup["target_forwards"] and stats["accepted_tokens"] == lookup["accepted_tokens"]
    assert {int(k): v for k, v in stats["accepted_lengths"].items()} == {
        n: lookup["accepted_lengths"].count(n) for n in set(lookup["accepted_lengths"])}
