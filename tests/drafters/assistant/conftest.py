"""Tiny Gemma-4 pairs for the assistant's tests: a random target and assistants that are mostly wrong, always wrong,
or copy their input token (accepted along the target's runs of one token)."""

from __future__ import annotations

import pytest
import torch

try:
    import transformers  # noqa: F401
    from transformers import Gemma4AssistantForCausalLM  # noqa: F401

    HAS_GEMMA4 = True
except ImportError:
    HAS_GEMMA4 = False

SEED_EOS = 3  # this target ends its greedy text with EOS (token 1) after 25 tokens
SEED_RUNS = 4  # this one repeats tokens (10 x6, 11 x8 ...): an assistant copying its input is accepted there
PROMPTS = ([2, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [2, 40, 41, 42, 43], [2, 17, 3, 88, 64, 64, 12, 9, 30])


def target(seed: int = SEED_RUNS, **overrides):
    from hf_speculative.drafters.assistant.tiny import tiny_target

    return tiny_target(seed=seed, **overrides)


def random_assistant(target, seed: int = 7, **overrides):
    from hf_speculative.drafters.assistant.tiny import tiny_assistant

    return tiny_assistant(target, seed=seed, **overrides)


def copy_assistant(target, follows: dict[int, int] | None = None):
    """An assistant whose argmax after token ``t`` is ``follows.get(t, t)`` (default: it copies its input token): its
    layers add nothing (zero output projections), its input projection passes the target's embedding of the token
    through, and its tied lm_head holds, at row ``j``, the (unit) embeddings of the tokens it maps to ``j``."""
    assistant = random_assistant(target, hidden_size=target.config.hidden_size)
    width = target.config.hidden_size
    embeddings = target.model.embed_tokens.weight
    with torch.no_grad():
        for layer in assistant.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        assistant.pre_projection.weight.zero_()
        assistant.pre_projection.weight[:, :width] = torch.eye(width)
        if follows is None:
            assistant.model.embed_tokens.weight.copy_(4 * embeddings)  # x4: peaked enough for trees to grow deep
        else:
            table = torch.zeros_like(embeddings)
            for token in range(embeddings.shape[0]):
                norm = embeddings[token].norm()
                if norm > 0:  # (the pad token's row is zero)
                    table[follows.get(token, token)] += embeddings[token] / norm
            assistant.model.embed_tokens.weight.copy_(4 * table)
    return assistant


def bigram_assistant(target, text: list[int]):
    """An assistant drafting ``text``'s continuation: after a token, the one that followed its first occurrence."""
    follows: dict[int, int] = {}
    for token, after in zip(text, text[1:]):
        follows.setdefault(token, after)
    return copy_assistant(target, follows)


def wrong_assistant(target, token: int = 0):
    """An assistant that always drafts ``token`` (the pad id, which greedy never writes)."""
    assistant = random_assistant(target)

    def push(module, args, output):
        output = output.clone()
        output[..., token] += 1000.0
        return output

    assistant.lm_head.register_forward_hook(push)
    return assistant


@pytest.fixture(autouse=True)
def _needs_gemma4(request):
    if not HAS_GEMMA4 and "tf4" not in request.node.name:
        pytest.skip("transformers without Gemma-4 assistants (they arrived in 5.24)")
