"""``hfs.Assistant``: a Gemma-4 assistant (transformers' ``Gemma4AssistantForCausalLM``) drafting for its target.

transformers runs these in its own assisted loop (``SinglePositionMultiTokenCandidateGenerator``); this is the same
drafting in hf_speculative's loop, chains and trees. Every draft starts from the newest verified token (the root, at
position ``p``) and the target's normed last hidden state at ``p - 1`` (the state that chose the root), read by a
forward hook on the target's final norm. One assistant forward takes ``[embed(token), h]`` `[.., 2 H_target]` at the
fixed position ``p`` and attends, in every layer, to the K/V of the target's store layers over ``[0, p)`` (read from the
target's cache after the loop kept the accepted path: see ``pairing``); it returns logits for the next token and a new
``h`` (its output projected back to the target's width), which the next step takes with the token it drafted.

Nothing a step drafts enters any cache, so a tree costs one assistant forward per depth: a depth's nodes are rows of
one forward (``[embed(node), h(parent)]`` each), which attend to the shared K/V only, never to each other.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import torch

from ... import compat
from ...core.chain_drafting import draft_chain
from ...core.budget import Plan
from ...core.costs import draft_price, record_draft_step
from ...core.features import FeatureTap
from ...core.policy import check_chain_options
from ...core.draft_guide import DraftGuide
from ...core.tree import ROOT, DraftTree, Verdict
from ...core.tree_shapes import DynamicTree, StaticTree, grow_tree
from ...options import CheckedOnAssignment, shown
from ...registry import integrity
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import TreeOrChainCandidateGenerator, check_network_once
from ..registry import Capabilities, ExampleNotApplicable, SpecFiles, example_label
from .pairing import check_pair, gemma4_assistant_classes, shared_kv, sliding_reach


@dataclasses.dataclass(eq=False)
class Assistant(CheckedOnAssignment, DraftStrategy, method="gemma4-assistant",
                capabilities=Capabilities(trees=True, reads_target="features", static_cache=False),
                examples=("gemma4-assistant", "gemma4-assistant-tree"), live_fields=("assistant",),
                # a spec names the assistant (its folder inside the model's); one loaded from elsewhere is saved there
                files=SpecFiles(network="model", subfolder="assistant")):
    """Draft with a Gemma-4 assistant on its Gemma-4 target's hidden state and shared K/V.

    Args:
        assistant (`Gemma4AssistantForCausalLM`): the assistant (or the Unified one), on the target's device and
            dtype (see :meth:`from_pretrained`).
        num_tokens (`int`, defaults to 4): the longest chain (one assistant forward per token).
        confidence_threshold (`float`, defaults to 0.05): end a chain after a token the assistant gives less than this
            probability (0 disables).
        adaptive (`bool`, defaults to `True`): draft a token only while its calibrated chance of acceptance pays for
            drafting and verifying it; trees: the node count per step follows the measured costs.
        draft_cost (`float`, *optional*): one assistant forward in target forwards; measured by default.
        tree (`DynamicTree` or `StaticTree`, *optional*): draft a tree verified in one forward by hf_speculative's
            loop: ``hfs.DynamicTree(nodes, depth, top_k)`` grows EAGLE-2's tree (the ``top_k`` guesses of the
            ``top_k`` likeliest nodes per depth, the best ``nodes`` kept); ``hfs.StaticTree(paths)`` fixed rank paths.
            One assistant forward per depth. ``None``: chains.
    """

    assistant: torch.nn.Module = dataclasses.field(repr=False)
    num_tokens: int = 4
    confidence_threshold: float = 0.05
    adaptive: bool = True
    draft_cost: float | None = None
    tree: DynamicTree | StaticTree | None = None

    def __post_init__(self):
        classes = gemma4_assistant_classes()  # an ImportError naming the transformers version needed
        if not isinstance(self.assistant, classes):
            raise TypeError(f"Assistant(assistant=...) needs a {' or a '.join(c.__name__ for c in classes)} (load one "
                            f"with hfs.Assistant.from_pretrained(path, target=model)), got "
                            f"{type(self.assistant).__name__}; for another draft model use hfs.DraftModel.")
        check_chain_options(self)
        if self.tree is not None and not isinstance(self.tree, (DynamicTree, StaticTree)):
            raise ValueError(f"Assistant(tree={shown(self.tree)}): use hfs.DynamicTree(nodes=..., depth=..., "
                             "top_k=...), hfs.StaticTree(paths) or None for chains.")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, target: torch.nn.Module | None = None,
                        **options: Any) -> Assistant:
        """Load an assistant with transformers (``AutoModelForCausalLM``: a folder or a Hub id such as
        ``google/gemma-4-E2B-it-assistant``) in the target's dtype, on its device, checked against it.

        Args:
            path (`str`): the assistant's folder or Hub id.
            target (`PreTrainedModel`, *optional*): the Gemma-4 model it drafts for.
            **options: ``num_tokens``, ``confidence_threshold``, ``adaptive``, ``draft_cost``, ``tree``.
        """
        gemma4_assistant_classes()
        from transformers import AutoModelForCausalLM

        if os.path.isdir(path):  # a folder: its files checked before transformers opens them (a link out, a FIFO)
            integrity.check_model_folder(path, f"Assistant.from_pretrained(path={shown(os.fspath(path))})")

        extra = {} if target is None else compat.dtype_kwargs(next(target.parameters()).dtype)
        assistant = AutoModelForCausalLM.from_pretrained(path, **extra).eval().requires_grad_(False)
        if target is not None:
            assistant.to(next(target.parameters()).device)
        strategy = cls(assistant=assistant, **options)
        if target is not None:
            strategy.validate_target(target)
        return strategy

    def validate_target(self, target: torch.nn.Module) -> None:
        check_network_once(target, self.assistant, lambda t: check_pair(self.assistant, t), "The assistant",
                           "assistant")

    def open(self, ctx: CallContext) -> AssistantCandidateGenerator:
        return AssistantCandidateGenerator(ctx, self)

    # -- its spec (hf/spec.py) and its examples ----------------------------------------------------------
    def spec_path(self) -> str | None:
        name = getattr(self.assistant, "name_or_path", "")
        return str(name) if name else None

    def spec_network(self) -> torch.nn.Module:
        return self.assistant

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> Assistant:
        return cls(network, **options)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> Assistant:
        """A random assistant shaped for the Gemma-4 ``target`` (:func:`random_assistant`): ``"gemma4-assistant"``
        chains of 4, ``"gemma4-assistant-tree"`` trees 3 wide; fixed lengths. Other targets:
        :class:`~hf_speculative.drafters.registry.ExampleNotApplicable`."""
        label = example_label(cls, label)
        try:
            assistant = random_assistant(target)
        except (ImportError, ValueError) as why:
            raise ExampleNotApplicable(str(why)) from None
        tree = DynamicTree(nodes=8, depth=4, top_k=3) if label == "gemma4-assistant-tree" else None
        settings = {"assistant": assistant, "tree": tree, "num_tokens": 4, "confidence_threshold": 0.0,
                    "adaptive": False}
        return cls(**{**settings, **options})

    @classmethod
    def example_target(cls, seed: int = 3, **overrides: Any) -> torch.nn.Module:
        """A tiny random Gemma-4 target (:func:`~.tiny.tiny_target`) on which :meth:`example` builds."""
        from .tiny import tiny_target

        return tiny_target(seed=seed, **overrides)


def random_assistant(target: torch.nn.Module, seed: int = 7, **overrides: Any) -> torch.nn.Module:
    """A random 2-layer assistant shaped for the Gemma-4 ``target`` (its store layers' K/V shapes, its hidden size and
    vocabulary), seeded with ``seed``, in the target's dtype and device: the matrix's example."""
    from .tiny import tiny_assistant

    return tiny_assistant(target, seed=seed, **overrides)


class AssistantCandidateGenerator(TreeOrChainCandidateGenerator):
    """Per-call state: the target's newest usable hidden state and the cache its forwards use.

    Invariant between forwards: ``self.last`` `[1, 1, H_target]` is the target's normed last hidden state at
    ``L - 2`` (``L`` = verified length), the state that chose token ``L - 1`` (the next draft's root, at ``p = L - 1``);
    ``self.cache`` the cache the target's last forward used, which then holds the K/V of ``[0, p)``.
    """

    def __init__(self, ctx: CallContext, config: Assistant):
        super().__init__(ctx)
        self.config = config
        self.net = config.assistant
        self.store = check_pair(self.net, ctx.target)
        self.reach = sliding_reach(self.net)
        self.embed = ctx.target.get_input_embeddings()  # the target's (scaled) embedding, as transformers feeds it
        self.tap = FeatureTap(ctx.target, [], view=ctx.view)  # [] = the final norm's output
        self.last: torch.Tensor | None = None
        self.cache: Any = None
        decoder = compat.decoder_of(ctx.target)
        thread = self.tap._thread
        self._hook = decoder.register_forward_pre_hook(
            lambda module, args, *kwargs: self._saw_cache(thread, kwargs), with_kwargs=True)
        self._size_tree_or_chain(ctx, config)

    def _saw_cache(self, thread: int, kwargs: tuple[dict, ...]) -> None:
        # ``kwargs`` is ``()`` when a forward on another thread runs the hook in the moment torch has added it but
        # not yet marked it as taking kwargs (registration is not thread-safe); only this call's thread reads them
        import threading

        if threading.get_ident() == thread and kwargs:
            self.cache = kwargs[0].get("cache", kwargs[0].get("past_key_values"))

    def _draft_price(self) -> float:
        # until measured: a few layers without K/V projections against a whole model
        return draft_price(self.net, self.verify_costs, self.config.draft_cost, 0.1)

    def _run(self, tokens: torch.Tensor, hidden: torch.Tensor, kv: dict, position: int):
        """One assistant forward for ``k`` nodes: their tokens `[k]` and their parents' ``h`` `[k, H_target]`, all at
        ``position``. Returns logits over the target's vocabulary `[k, V]` (float32) and the new ``h`` `[k, H_target]`.

        With ``k > 1`` it asks for hidden states: transformers 5.24's ``_maybe_slice_kv_shared_inputs`` otherwise
        slices the (absent) per-layer inputs of an assistant and fails; recording them turns that slicing off."""
        start = time.perf_counter()
        k, device = tokens.numel(), hidden.device
        embeds = torch.cat([self.embed(tokens.to(device)[None]), hidden[None].to(self.embed.weight.dtype)], dim=-1)
        length = kv["full_attention"][0].shape[-2]
        out = self.net(inputs_embeds=embeds, attention_mask=torch.ones(1, length, dtype=torch.long, device=device),
                       position_ids=torch.full((1, k), position, dtype=torch.long, device=device),
                       shared_kv_states=kv, use_cache=False, **({"output_hidden_states": True} if k > 1 else {}))
        record_draft_step(self.net, time.perf_counter() - start)
        return self._to_target_vocab(out.logits[0]), out.last_hidden_state[0]  # [k, V], [k, H_target]

    def _start(self, sequence: torch.LongTensor):
        """The shared K/V and the root's forward: ``(kv, position, logits [V], h [H_target])``, or ``None``."""
        if self.last is None or self.cache is None:
            return None  # before the prefill (or a forward not seen): nothing to draft from
        position = sequence.shape[1] - 1  # the root's
        kv = shared_kv(self.cache, self.store, position, self.reach)
        if kv is None:
            return None
        logits, hidden = self._run(sequence[0, -1:], self.last, kv, position)
        return kv, position, logits[0], hidden[0]

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.last is None or self.cache is None:
            return DraftTree.empty(sequence.device)
        return super().draft(sequence, plan)

    def _chain(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if not plan.start_chain():
            return DraftTree.empty(sequence.device)
        started = self._start(sequence)
        if started is None:
            return DraftTree.empty(sequence.device)
        kv, position, logits, hidden = started

        def step(token: int) -> torch.Tensor:
            nonlocal hidden
            logits, out = self._run(torch.tensor([token]), hidden[None], kv, position)
            hidden = out[0]
            return logits[0]

        return draft_chain(plan, self.ctx, sequence, logits, min(plan.depth, self.config.num_tokens), step)

    def _tree(self, sequence: torch.LongTensor, nodes: int, plan: Plan) -> DraftTree:
        """One step's tree of at most ``nodes`` nodes: one assistant forward per depth over the nodes expanded there."""
        started = self._start(sequence)
        if started is None:
            return DraftTree.empty(sequence.device)
        kv, position, logits, root_hidden = started
        hidden_of = {ROOT: root_hidden}  # node -> the assistant's h after it (what its children's forward takes)

        def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
            logits, out = self._run(tokens, torch.stack([hidden_of[p] for p in parents]), kv, position)
            for i, node in enumerate(frontier):
                hidden_of[node] = out[i]
            return logits  # [k, V]: the grower processes and normalises them per branch

        tree = grow_tree(self.config.tree, logits, expand, nodes, plan.depth,
                         DraftGuide(self.ctx.logits_processor, sequence))  # the call's processors per node
        return DraftTree(tree.tokens.to(sequence.device), tree.parents.to(sequence.device), tree.q)

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Keep the target's hidden state that chose the newest token: the last accepted node's row of the forward
        (the root's when none was), whichever drafter's tree it verified (e.g. in ``hfs.Hybrid``)."""
        states = self.tap.take()  # [1, T, H]: the forward's rows (its prompt's too at the prefill)
        if states is None or states.shape[1] < 1 + tree.size:
            self.last = None
            return
        row = states.shape[1] - (1 + tree.size) + (1 + verdict.path[-1] if verdict.path else 0)
        self.last = states[:, row]  # [1, H]

    def close(self) -> None:
        self.tap.remove()
        self._hook.remove()
        self.last = self.cache = None
