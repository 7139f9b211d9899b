"""``core/kv_room.py``: a dynamic cache whose layers write new positions in place holds, after any sequence of
forwards, crops and tree-path moves, exactly what transformers' own layers hold, and gives the same logits."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import hf_speculative as hfs
from hf_speculative import compat
from hf_speculative.core import kv_cache, kv_room
from tests.conftest import ARCHS, build_model, prompt_inputs, stock_generate


@pytest.fixture(autouse=True)
def in_place_at_any_size(monkeypatch):
    """The tiny models' caches are far below the size kv_room appends by copying: these tests write them in place."""
    monkeypatch.setattr(kv_room, "COPY_BELOW_BYTES", 0)


def _forward(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=True, **{compat.cache_kwarg(): cache}).logits[0]


def _layers(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


def test_forwards_crops_and_path_moves_match_transformers_layers():
    """The same steps on a plain cache and a roomy one: equal logits at every forward, equal keys and values after
    every crop and tree-path move, and the stores reused (no copy of the cache) until they fill."""
    model = build_model("llama")
    plain, roomy = kv_cache.new_dynamic_cache(), kv_cache.new_dynamic_cache()
    prompt = prompt_inputs()["input_ids"][0].tolist()
    assert torch.equal(_forward(model, plain, prompt), _forward(model, roomy, prompt))
    assert kv_room.make_room(roomy) == len(roomy.layers) > 0
    assert kv_room.make_room(roomy) == 0  # idempotent
    # (tokens of a forward, the nodes kept): chains cropped, trees whose kept path moves down, all kept
    steps = [([4, 5, 6, 7, 8], [0, 1]), ([9, 3], [0, 1]), ([5] * 11, [0, 3, 4]), ([6], [0]), ([7, 8, 9, 3], [0, 2])]
    for tokens, path in steps * 60:  # ~1,400 positions: the stores fill and grow several times
        start = kv_cache.cache_length(plain)
        assert torch.equal(_forward(model, plain, tokens), _forward(model, roomy, tokens))
        kv_cache.keep_tree_path(plain, start, path, len(tokens))
        kv_cache.keep_tree_path(roomy, start, path, len(tokens))
        for (pk, pv), (rk, rv) in zip(_layers(plain), _layers(roomy)):
            assert torch.equal(pk, rk) and torch.equal(pv, rv)
    layer = roomy.layers[0]
    store = layer._hfs_keys.data_ptr()
    room = layer._hfs_keys.shape[-2] - layer.keys.shape[-2]
    _forward(model, roomy, [3] * min(room, 4))
    assert layer._hfs_keys.data_ptr() == store and layer.keys.data_ptr() == store  # written in place


def test_tensors_assigned_from_outside_are_adopted():
    """A layer's keys and values replaced by others (a batch's row selection, a user's edit) are copied into a fresh
    store at the next update, even when they are laid out like the store (same strides, another buffer), and the
    cache then matches a plain one that holds the same history."""
    model = build_model("qwen2")
    plain, roomy = kv_cache.new_dynamic_cache(), kv_cache.new_dynamic_cache()
    prompt = prompt_inputs()["input_ids"][0].tolist()
    _forward(model, plain, prompt), _forward(model, roomy, prompt)
    kv_room.make_room(roomy)
    _forward(model, plain, [4, 5]), _forward(model, roomy, [9, 9])  # different histories
    for ours, theirs in zip(roomy.layers, plain.layers):
        for name, store in (("keys", ours._hfs_keys), ("values", ours._hfs_values)):
            other = torch.zeros_like(store)  # laid out like the store, another buffer
            length = getattr(theirs, name).shape[-2]
            other[..., :length, :] = getattr(theirs, name)
            setattr(ours, name, other[..., :length, :])
    assert torch.equal(_forward(model, plain, [6, 7, 8]), _forward(model, roomy, [6, 7, 8]))
    for (pk, pv), (rk, rv) in zip(_layers(plain), _layers(roomy)):
        assert torch.equal(pk, rk) and torch.equal(pv, rv)
    ours = roomy.layers[0]
    assert ours.keys.data_ptr() == ours._hfs_keys.data_ptr()


def test_only_cpu_full_attention_layers_change_and_the_cache_copies():
    """Uninitialised layers and sliding-window ones keep transformers' class; a roomy cache deep-copies and pickles
    into an independent cache of the same contents."""
    from transformers.cache_utils import DynamicLayer

    model = build_model("llama")
    cache = kv_cache.new_dynamic_cache()
    assert kv_room.make_room(cache) == 0  # no layers yet
    _forward(model, cache, prompt_inputs()["input_ids"][0].tolist())
    kv_room.make_room(cache)
    assert all(type(layer) is not DynamicLayer and isinstance(layer, DynamicLayer) for layer in cache.layers)
    for clone in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(_layers(cache), _layers(clone)))
        _forward(model, clone, [4, 5, 6])
        assert kv_cache.cache_length(clone) == kv_cache.cache_length(cache) + 3
    if "gemma3" in ARCHS:  # sliding-window layers (transformers 5.x's Gemma3) keep their class
        windowed = kv_cache.new_dynamic_cache()
        _forward(build_model("gemma3"), windowed, prompt_inputs()["input_ids"][0].tolist())
        before = [type(layer) for layer in windowed.layers]
        kv_room.make_room(windowed)
        assert [type(layer) for layer in windowed.layers] == [
            kind if kind is not DynamicLayer else kv_room._roomy_class(DynamicLayer) for kind in before]


def test_generate_is_greedy_and_returns_a_cache_that_goes_on():
    """Through generate(): prompt lookup on a roomy cache is token-identical to greedy, and the cache it returns
    continues a second call exactly as transformers' own would."""
    model = hfs.enable(build_model("llama"))
    inputs = prompt_inputs()
    ref = stock_generate(model, **inputs, do_sample=False, max_new_tokens=60)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=60, return_dict_in_generate=True,
                         candidate_generator=hfs.PromptLookup())
    assert out.sequences.tolist() == ref.tolist()
    cache = getattr(out, compat.cache_kwarg(), None) or out.past_key_values
    assert any(type(layer).__name__ == "RoomyDynamicLayer" for layer in cache.layers)
    longer = stock_generate(model, **inputs, do_sample=False, max_new_tokens=80)
    again = model.generate(input_ids=ref, attention_mask=torch.ones_like(ref), do_sample=False, max_new_tokens=20,
                           candidate_generator=hfs.PromptLookup(), **{compat.cache_kwarg(): cache})
    assert again.tolist() == longer.tolist()


def test_a_small_cache_is_appended_by_copying_until_it_grows(monkeypatch):
    """Below ``COPY_BELOW_BYTES`` a layer appends as transformers' does (a new tensor each forward, no store): the copy
    is cheap and leaves the cache hot for the attention; the first update past it makes the store, and later ones
    write in place. Contents match a plain cache throughout."""
    model = build_model("llama")
    plain, roomy = kv_cache.new_dynamic_cache(), kv_cache.new_dynamic_cache()
    prompt = prompt_inputs()["input_ids"][0].tolist()
    _forward(model, plain, prompt), _forward(model, roomy, prompt)
    kv_room.make_room(roomy)
    layer = roomy.layers[0]
    per_token = 2 * layer.keys[..., :1, :].numel() * layer.keys.element_size()  # keys + values of one position
    limit = len(prompt) + 6
    monkeypatch.setattr(kv_room, "COPY_BELOW_BYTES", per_token * limit)
    kinds = []
    for step in range(12):
        assert torch.equal(_forward(model, plain, [4 + step % 5]), _forward(model, roomy, [4 + step % 5]))
        kinds.append(getattr(layer, "_hfs_keys", None) is not None
                     and layer.keys.data_ptr() == layer._hfs_keys.data_ptr())
    length_before = [len(prompt) + step for step in range(12)]  # the cache's length when each update came
    assert kinds == [n >= limit for n in length_before], kinds  # copied while small, then in place
    for (pk, pv), (rk, rv) in zip(_layers(plain), _layers(roomy)):
        assert torch.equal(pk, rk) and torch.equal(pv, rv)
