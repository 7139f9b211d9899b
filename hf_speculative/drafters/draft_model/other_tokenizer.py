"""A draft model whose tokenizer is not the target's (universal assisted generation, Timor et al. 2025).

The drafter keeps its own token sequence and its own KV cache. Every step:

1. the verified target tokens are decoded to text and encoded again with the drafter's tokenizer, from an *anchor*
   onwards (a target position where both tokenizations were found to split the text at the same place, about
   ``lookbehind`` target tokens back: a boundary that the newest tokens can still change is redone); the drafter's
   cache is cropped to the longest prefix its old tokens share with the new ones and the rest is fed;
2. the drafter drafts greedily in its own vocabulary, token by token while the loop's plan says it pays;
3. the drafted text is encoded with the target's tokenizer after the tail of the verified target tokens, and the
   target tokens past that tail are the draft: a chain whose length is known only now, cut to the plan's depth.

The target verifies the chain as any other, so the output is exactly the target's (greedy, seeded sampling, or
the rejection rule, where the chain is a point mass per token: there is no one-to-one map from the drafter's
distribution to the target's vocabulary here). Trees are not drafted: the branches of a drafter-token tree spell
texts whose target tokenizations share no node structure with it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import torch

from ... import compat
from ...core import kv_cache
from ...core.budget import Plan, Sizing
from ...core.costs import draft_price
from ...core.tree import DraftTree
from ...core.call import CallContext
from ..generator import SpeculativeCandidateGenerator
from .feed import feed, size_ratio

LOOKBEHIND = 10  # target tokens re-encoded behind the newest ones (transformers' target_lookbehind, the same default)
_REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes an incomplete UTF-8 character to


def check_tokenizer(owner: str, field: str, tokenizer: Any) -> None:
    """Raise ``TypeError`` unless ``tokenizer`` encodes, decodes and lists its vocabulary like a transformers one."""
    missing = [name for name in ("__call__", "decode", "get_vocab") if not callable(getattr(tokenizer, name, None))]
    if missing:
        raise TypeError(f"{owner}({field}=...) takes a transformers tokenizer (AutoTokenizer.from_pretrained(...)); "
                        f"got {type(tokenizer).__name__}, which has no {', '.join(m.strip('_') for m in missing)}.")


def vocabulary_mismatches(draft_tokenizer: Any, target_tokenizer: Any) -> list[str]:
    """The drafter's tokens that the target's tokenizer spells with another id or lacks (empty: the drafter's ids
    are the target's, and its drafts can be verified as they are)."""
    if draft_tokenizer is target_tokenizer:
        return []
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    return [tok for tok, i in draft_vocab.items() if target_vocab.get(tok) != i]


_BRIDGES: collections.OrderedDict[tuple[int, int], tuple[Any, Any, TokenizerBridge | None]] = \
    collections.OrderedDict()
_BRIDGES_KEPT = 8  # tokenizer pairs remembered (comparing two 150k vocabularies takes tens of milliseconds)
_BRIDGES_LOCK = threading.Lock()


def bridge_for(draft_tokenizer: Any, target_tokenizer: Any) -> TokenizerBridge | None:
    """The :class:`TokenizerBridge` of a pair whose vocabularies differ (:func:`vocabulary_mismatches`), else
    ``None``; built once per pair (the strategies the benchmark and the app build per call share it)."""
    key = (id(draft_tokenizer), id(target_tokenizer))
    with _BRIDGES_LOCK:
        known = _BRIDGES.get(key)
        if known is not None and known[0] is draft_tokenizer and known[1] is target_tokenizer:
            _BRIDGES.move_to_end(key)
            return known[2]
    mismatched = vocabulary_mismatches(draft_tokenizer, target_tokenizer)
    bridge = TokenizerBridge(draft_tokenizer, target_tokenizer) if mismatched else None
    with _BRIDGES_LOCK:
        _BRIDGES[key] = (draft_tokenizer, target_tokenizer, bridge)
        while len(_BRIDGES) > _BRIDGES_KEPT:
            _BRIDGES.popitem(last=False)
    return bridge


class TokenizerBridge:
    """Text in and out of the two tokenizers, the way the drafter sees the target's text.

    Special tokens are kept as text (a chat template's markers mean the same to two models of one template family),
    except the target's special tokens that the drafter's vocabulary does not have (its BOS, say), which are left
    out: spelled out character by character they would only mislead the drafter. The drafter's sequence starts with
    what its tokenizer puts before any text (its BOS).
    """

    def __init__(self, draft_tokenizer: Any, target_tokenizer: Any):
        self.draft, self.target = draft_tokenizer, target_tokenizer
        draft_vocab = draft_tokenizer.get_vocab()
        self.foreign = {int(i) for i in getattr(target_tokenizer, "all_special_ids", []) or []
                        if target_tokenizer.convert_ids_to_tokens(int(i)) not in draft_vocab}
        self.draft_start = [int(i) for i in draft_tokenizer("", add_special_tokens=True)["input_ids"]
                            if int(i) == getattr(draft_tokenizer, "bos_token_id", None)]
        # the drafter's own special tokens (its end of text) mean nothing to the target unless it has them too (a
        # chat template's markers): drafting stops before the others
        target_vocab = target_tokenizer.get_vocab()
        self.draft_stop = {int(i) for i in getattr(draft_tokenizer, "all_special_ids", []) or []
                           if draft_tokenizer.convert_ids_to_tokens(int(i)) not in target_vocab}

    def target_text(self, ids: list[int]) -> str:
        """The text of target tokens, as the drafter reads it."""
        return _decode(self.target, [i for i in ids if i not in self.foreign])

    def draft_ids(self, text: str) -> list[int]:
        return [int(i) for i in self.draft(text, add_special_tokens=False)["input_ids"]]

    def draft_text(self, ids: list[int]) -> str:
        return _decode(self.draft, ids)

    def target_ids(self, text: str) -> list[int]:
        return [int(i) for i in self.target(text, add_special_tokens=False)["input_ids"]]


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class OtherTokenizerCandidateGenerator(SpeculativeCandidateGenerator):
    """Per-call state of a :class:`~.drafter.DraftModel` whose tokenizer differs from the target's: the drafter's
    token sequence, its cache, and the anchor that bounds how much text is re-encoded each step.

    Args:
        ctx (`CallContext`): the call.
        config (`DraftModel`): the strategy (its ``tokenizer`` and ``target_tokenizer`` differ).
        bridge (`TokenizerBridge`): the pair's text conversions.
    """

    def __init__(self, ctx: CallContext, config: Any, bridge: TokenizerBridge):
        super().__init__(ctx)
        self.config, self.bridge, self.drafter = config, bridge, config.model
        self.cache = kv_cache.new_dynamic_cache()
        self.fed: list[int] = []  # drafter tokens whose keys/values are in self.cache
        self.draft_ids: list[int] = list(bridge.draft_start)  # the drafter's spelling of the verified text
        self.anchor = (0, len(self.draft_ids))  # (target position, drafter position) where both split the text
        self._keep_last = compat.logits_to_keep_kwargs(self.drafter, 1)
        self.verify_costs = ctx.verify_costs(config.num_tokens)
        self._size_ratio = size_ratio(self.drafter, ctx.target)
        self.sizing = Sizing(self.verify_costs, tokens=config.num_tokens, rule="confidence",
                             adaptive=config.adaptive, confidence_threshold=config.confidence_threshold,
                             draft_price=self._draft_price)

    def _draft_price(self) -> float:
        return draft_price(self.drafter, self.verify_costs, self.config.draft_cost, self._size_ratio)

    # -- the verified text, in the drafter's tokens --------------------------------------------------
    def _sync(self, target: list[int]) -> list[int]:
        """The drafter's tokens for the verified target tokens ``target``: the text from the anchor on encoded anew
        (boundaries the newest tokens changed are redone); the anchor then moves up to ``LOOKBEHIND`` tokens back."""
        at_target, at_draft = self.anchor
        text = self.bridge.target_text(target[at_target:])
        segment = self.bridge.draft_ids(text)
        self.draft_ids = self.draft_ids[:at_draft] + segment
        new_target = len(target) - LOOKBEHIND
        if new_target > at_target:
            # a boundary both tokenizers agree on: the text splits there and the drafter's tokens do too
            head, tail = self.bridge.target_text(target[at_target:new_target]), self.bridge.target_text(
                target[new_target:])
            if head + tail == text:
                head_ids = self.bridge.draft_ids(head)
                if segment == head_ids + self.bridge.draft_ids(tail):
                    self.anchor = (new_target, at_draft + len(head_ids))
        return self.draft_ids

    # -- the protocol -----------------------------------------------------------------------------
    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if not plan.start_chain():
            return DraftTree.empty(sequence.device)
        target = sequence[0].tolist()
        verified = self._sync(target)
        # crop the drafter's cache to what it shares with the new spelling; the last token is fed again for logits
        common = min(_common_prefix(self.fed, verified), len(verified) - 1)
        compat.crop_cache(self.cache, len(self.fed) - common)
        del self.fed[common:]
        logits = feed(self, verified[common:], sequence.device)  # [V_draft]
        drafted: list[int] = []
        forwards = 1
        while True:
            probs = torch.softmax(logits.float(), dim=-1)  # [V_draft]
            peak, token = (float(v) for v in probs.max(dim=-1))
            token = int(token)
            if token in self.bridge.draft_stop or not plan.wants(peak):
                break  # the drafter's own end of text means nothing to the target: it ends the draft
            drafted.append(token)
            if not plan.took(peak, self.config.num_tokens):
                break
            logits = feed(self, [token], sequence.device)
            forwards += 1
        plan.steps = forwards
        chain = self._target_chain(target, verified, drafted)[: plan.depth]
        # ids past the target's logits (a tokenizer larger than the model's vocabulary) cannot be verified
        width = self.ctx.vocab_size
        chain = chain[: next((i for i, t in enumerate(chain) if t >= width), len(chain))]
        return DraftTree.from_tokens(chain, sequence.device)

    def _target_chain(self, target: list[int], verified: list[int], drafted: list[int]) -> list[int]:
        """The target tokens that spell the drafted text after the verified target tokens ``target``."""
        if not drafted:
            return []
        bridge = self.bridge
        context = verified[max(len(verified) - LOOKBEHIND, len(bridge.draft_start)):]
        before, after = bridge.draft_text(context), bridge.draft_text(context + drafted)
        text = after[len(before):] if after.startswith(before) else bridge.draft_text(drafted)
        text = text.rstrip(_REPLACEMENT)  # an incomplete last character: its bytes are not known yet
        if not text:
            return []
        window = target[max(len(target) - LOOKBEHIND, 0):]
        spelled = bridge.target_ids(_decode(bridge.target, window) + text)
        if spelled[: len(window)] == window:
            return spelled[len(window):]
        # the drafted text changes how the verified tokens split (or the window does not re-encode as it was): the
        # verified tokens stay, so the draft is the text spelled alone
        return bridge.target_ids(text)

    def close(self) -> None:
        self.cache = None
        self.fed = []
        self.draft_ids = []
