"""``hfs.MTP``: draft with the target's own multi-token-prediction layers (DeepSeek-V3, GLM-4.5), as transformers'
``generate(use_mtp=True)`` does, in hf_speculative's loop: chains, Medusa-like trees, batches, static caches.

MTP layer ``k`` (transformers' ``MtpLayer``) reads the pair ``(g_j, x_{j+1+k})`` at position ``j + 1 + k``: ``g_j``
is the target's normed last hidden state at ``j`` for ``k = 0`` (what its lm_head reads) and layer ``k - 1``'s output
at row ``j`` (after its ``post_norm``) for deeper layers; the layer's output, through the target's lm_head, guesses
``x_{j+2+k}``. Each layer keeps its own KV cache, fed the *verified* pairs only: after each target forward the
accepted path's hidden states come from the feature tap, drafted rows are cropped away as soon as the draft is made.
Under ``hfs.enable(model, compile=...)`` the layers draft on fixed-address buffers instead, each step one compiled
region read once (``captured.py``, ``static_step.py``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from ... import compat, options
from ...core import kv_cache
from ...core.chain_drafting import draft_chain, host_chooses
from ...core.budget import CHAIN, Plan, Sizing
from ...core.costs import draft_price, record_draft_step
from ...core.features import VerifiedFeatures
from ...core.state import state_of
from ...core.tree import DraftTree, Verdict, additive_mask
from ...core.tree_shapes import StaticTree, grow_paths, grow_paths_on_device
from ...core.draft_guide import DraftGuide, first_guess
from ...options import CheckedOnAssignment, shown
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, ExampleNotApplicable, example_label
from . import modules as mtp_modules


@dataclasses.dataclass(eq=False)
class MTP(CheckedOnAssignment, DraftStrategy, method="mtp",
          capabilities=Capabilities(trees=True, batch=True, reads_target="features"),
          examples=("mtp", "mtp-tree"), live_fields=("modules",)):
    """Draft with the target's own MTP layers: no extra weights.

    Args:
        modules (`MtpModel`, *optional*): transformers' ``MtpModel`` built for the target. ``None`` (default):
            ``MtpModel.from_pretrained(target)`` on first use, from the folder the target was loaded from (kept with
            the model until ``hfs.forget(model)``).
        num_tokens (`int`, *optional*): the longest chain. Default: one token per MTP layer (1 for DeepSeek-V3 and
            GLM-4.5, as transformers drafts). More reuses the last layer recursively (vLLM's way): it reads its own
            previous output (after its ``post_norm``, as depth ``k + 1`` reads depth ``k``'s) and the token it drafted.
        tree (`StaticTree`, *optional*): draft a tree of ranked guesses, Medusa-like: depth ``d`` of a rank path is
            the ``d``-th MTP step's guess of that rank, every step conditioned on the top-ranked chain. ``None``:
            chains. The loop's tree budget decides how many of its paths (parents first) each step drafts.
        confidence_threshold (`float`, defaults to 0.05): end a chain after a guess below this probability.
        adaptive (`bool`, defaults to `True`): draft only what the measured costs and acceptance pay for.
        draft_cost (`float`, *optional*): one MTP step in target forwards; measured by default.
    """

    modules: Any = dataclasses.field(default=None, repr=False)
    num_tokens: int | None = None
    tree: StaticTree | None = None
    confidence_threshold: float = 0.05
    adaptive: bool = True
    draft_cost: float | None = None

    def __post_init__(self):
        mtp_model = mtp_modules.mtp_model_class()  # an ImportError naming the version needed on transformers 4.x
        owner = type(self).__name__
        if self.modules is not None and not isinstance(self.modules, mtp_model):
            raise TypeError(f"MTP(modules=...) takes transformers' MtpModel (MtpModel.from_pretrained(model)) or None "
                            f"to load the target's own, got {type(self.modules).__name__}.")
        if self.num_tokens is not None:
            self.num_tokens = options.check_int(owner, "num_tokens", self.num_tokens, 1, options.MAX_DRAFT_TOKENS)
        self.confidence_threshold = options.check_number(owner, "confidence_threshold", self.confidence_threshold,
                                                         0.0, 1.0, below_high=True)
        self.adaptive = options.check_bool(owner, "adaptive", self.adaptive)
        if self.draft_cost is not None:
            self.draft_cost = options.check_number(owner, "draft_cost", self.draft_cost, 0.0, options.MAX_DRAFT_COST)
        if self.tree is not None and not isinstance(self.tree, StaticTree):
            raise ValueError(f"MTP(tree={shown(self.tree)}): use hfs.StaticTree(paths) (rank paths; depth d is the d-th "
                             "MTP step's guesses) or None for chains.")

    @classmethod
    def from_pretrained(cls, target: torch.nn.Module, **options: Any) -> MTP:
        """The target's own MTP layers, loaded now from its folder (``hfs.MTP()`` loads them on first use)."""
        return cls(modules=modules_for(target), **options)

    def validate_target(self, target: torch.nn.Module) -> None:
        if self.modules is None:
            mtp_modules.num_mtp_layers(target)
        elif self.modules not in state_of(target).checked:
            mtp_modules.check_modules(self.modules, target)
            state_of(target).checked.add(self.modules)

    def draft_budget(self) -> int | None:
        if self.tree is not None:
            return self.tree.size
        return self.num_tokens or (None if self.modules is None else len(self.modules.layers))

    def open(self, ctx: CallContext) -> MTPCandidateGenerator:
        self.validate_target(ctx.target)
        return MTPCandidateGenerator(ctx, self, self.modules if self.modules is not None else modules_for(ctx.target))

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> MTP:
        """Random MTP layers built for the tiny ``target`` (:func:`~.modules.random_modules`): ``"mtp"`` two layers
        drafting chains of 3 (the last layer reused once), ``"mtp-tree"`` one layer and a tree 3 wide at the top."""
        label = example_label(cls, label)
        try:
            mtp_modules.mtp_model_class()
        except ImportError as error:
            raise ExampleNotApplicable(str(error)) from None
        tree = StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]) if label == "mtp-tree" else None
        layers = 1 if label == "mtp-tree" else 2
        settings = {"modules": mtp_modules.random_modules(target, layers, scale=0.3), "tree": tree, "num_tokens": 3,
                    "confidence_threshold": 0.0, "adaptive": False}
        return cls(**{**settings, **options})


@dataclasses.dataclass(eq=False)
class TargetModules:
    """What ``hfs.MTP`` keeps about a target, in its state (``state_of(target).drafter_state(TargetModules)``;
    ``hfs.forget(target)`` drops it): ``modules``, its own MTP layers loaded from its folder (:func:`modules_for`)."""

    modules: Any = None


def modules_for(target: torch.nn.Module) -> Any:
    """The target's own MTP layers, loaded from its folder once per model (:class:`TargetModules`)."""
    state = state_of(target)
    with state.lock:
        own = state.drafter_state(TargetModules)
        if own.modules is None:
            own.modules = mtp_modules.load_modules(target)
        return own.modules


class MTPCandidateGenerator(SpeculativeCandidateGenerator):
    """Per-call state: the verified features, the MTP layers' own KV cache and what each layer has been fed.

    Row ``j`` of layer ``k`` is the pair at position ``j + 1 + k``. Between drafts, layer ``k``'s cache holds its
    rows ``[0, fed[k])``, all computed from verified tokens; ``carry[k]`` `[1, r, H]` holds the inputs of its next
    verified rows ``[fed[k], fed[k - 1])`` (layer ``k - 1``'s outputs; for ``k = 0`` the target's features not fed yet,
    queued in ``features``). A draft after the verified length ``L`` runs layer 0 over its new rows up to ``L - 2``
    (the last one guesses token ``L``), and each further step the next layer (or the last one again) over its rows up
    to the newest drafted token; afterwards every layer is cropped back to its verified rows (``L - 1 - k``).
    """

    def __init__(self, ctx: CallContext, config: MTP, modules: Any):
        super().__init__(ctx)
        self.config = config
        self.modules = modules
        self.num_layers = len(modules.layers)
        self.max_tokens = config.num_tokens or self.num_layers
        self.features = VerifiedFeatures(ctx.target, [], view=ctx.view)  # [] = the final norm's output
        self.cache = kv_cache.new_dynamic_cache()
        self.fed = [0] * self.num_layers
        self.carry: list[torch.Tensor | None] = [None] * self.num_layers
        self.broken = False
        types = getattr(modules.config, "layer_types", None)
        window = getattr(modules.config, "sliding_window", None)
        self.windows = [window if types is not None and types[k] == "sliding_attention" else None
                        for k in range(self.num_layers)]
        nodes = 0 if config.tree is None else config.tree.size
        self.static = self._open_static(ctx)  # under compile=: the fixed-shape step (captured.py), else None
        self.verify_costs = ctx.verify_costs(max(self.max_tokens, nodes))
        self.sizing = Sizing(self.verify_costs, tokens=self.max_tokens, nodes=nodes, rule="confidence",
                             adaptive=config.adaptive, confidence_threshold=config.confidence_threshold,
                             draft_price=self._draft_price)

    def _open_static(self, ctx: CallContext) -> Any:
        """Fixed-shape drafting (``captured``) when the target is compiled, else ``None`` (eager drafting)."""
        from ...core.static_cache import compiled_mode
        from .captured import open_static

        mode = compiled_mode(ctx.target)
        if mode is None:
            return None
        depth = max(self.max_tokens, 0 if self.config.tree is None else self.config.tree.depth)
        return open_static(ctx.target, self.modules, mode, vocab_size=ctx.vocab_size, max_length=ctx.max_length,
                           catch_width=depth + 1, depth=depth)

    def _draft_price(self) -> float:
        # one decoder layer (a MoE one for real MTP targets) against the whole model, until measured
        return draft_price(self.modules, self.verify_costs, self.config.draft_cost, 0.05)

    # -- one MTP layer over some rows ----------------------------------------------------------------------
    def _run(self, k: int, layer: int, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Append rows to layer ``k``'s cache with MTP layer ``layer`` (``k`` itself, or the last layer reused):
        ``hidden`` `[1, r, H]`, ``tokens`` `[1, r]`, at the positions after its cached ones; their outputs
        `[1, r, H]` (after ``post_norm``, and the shared post-norm of models that have one)."""
        start = time.perf_counter()
        m, r = self.modules, tokens.shape[1]
        cached = compat.cache_layer_length(self.cache, k)
        device = hidden.device
        positions = torch.arange(cached + k + 1, cached + k + 1 + r, device=device)[None]  # [1, r]
        keys = torch.arange(k + 1, cached + k + 1 + r, device=device)  # [cached + r] their positions
        seen = keys[None, :] <= positions[0, :, None]  # [r, cached + r] causal over the layer's own rows
        if self.windows[layer] is not None:
            seen &= keys[None, :] > positions[0, :, None] - self.windows[layer]
        embeds = m.embed_tokens(tokens).to(device)  # [1, r, H]
        rope = {}
        if m.rotary_emb is not None:
            kind = {"layer_type": m.config.layer_types[layer]} if m.has_per_layer_rope else {}
            rope["position_embeddings"] = m.rotary_emb(embeds, position_ids=positions, **kind)
        out = m.layers[layer](embeds, hidden.to(embeds.dtype), attention_mask=additive_mask(seen, embeds.dtype),
                              position_ids=positions, cache=self.cache, **rope)  # [1, r, H]
        if m.use_shared_post_norm:
            out = m.shared_post_norm(out)
        record_draft_step(self.modules, time.perf_counter() - start)
        return out

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        """The target vocabulary's logits `[V]` (float32) for the last row of ``out`` `[1, r, H]`."""
        return self._to_target_vocab(self.modules._project_to_logits(out[:, -1:])[0])[0]

    # -- a draft: the first guess, the next ones, the crop -------------------------------------------------------
    def _begin(self, sequence: torch.LongTensor) -> torch.Tensor | None:
        """Feed layer 0 its new verified rows; the logits of the first guess `[V]` (``None``: features missing)."""
        length = sequence.shape[1]
        fresh = self.features.pop()  # [1, P, H]
        parts = [x for x in (self.carry[0], fresh) if x is not None]
        hidden = torch.cat(parts, dim=1) if parts else None
        if hidden is None or hidden.shape[1] != length - 1 - self.fed[0]:
            self.broken = hidden is not None  # features and tokens no longer line up: stop drafting (still exact)
            self.carry[0] = hidden
            return None
        self._length, self._drafts, self._spec = length, [], None
        out = self._run(0, 0, hidden, sequence[:, self.fed[0] + 1:length])  # rows [fed0, L - 1)
        self._after(0, out)
        return self._logits(out)

    def _after(self, k: int, out: torch.Tensor) -> None:
        """Layer ``k`` ran over its rows ``[fed[k], L - 1)``: its rows ``< L - 1 - k`` are verified."""
        verified = self._length - 1 - k - self.fed[k]
        if k + 1 < self.num_layers:
            kept = out[:, :verified]
            self.carry[k + 1] = kept if self.carry[k + 1] is None else torch.cat([self.carry[k + 1], kept], dim=1)
        self._spec = out[:, verified:]  # the rows that read drafted tokens, for the next layer
        # what stays to feed: layer k - 1's verified outputs from row L - 1 - k on (none for layer 0)
        self.carry[k] = None if k == 0 else self.carry[k][:, verified:]
        self.fed[k] = self._length - 1 - k
        self._last = out[:, -1:]  # [1, 1, H]

    def _next(self, sequence: torch.LongTensor, token: int | torch.Tensor) -> torch.Tensor:
        """The logits `[V]` after the drafted ``token`` (an int, or a device tensor ``[]`` that is not read): the next
        layer over its rows, or the last one again."""
        self._drafts.append(token.reshape(1) if isinstance(token, torch.Tensor) else sequence.new_tensor([token]))
        depth, length = len(self._drafts), self._length
        text = torch.cat([sequence[0], *self._drafts])[None]  # [1, L + depth]
        if depth < self.num_layers:
            k = depth
            hidden = torch.cat([self.carry[k], self._spec], dim=1)  # rows [fed[k], L - 1)
            out = self._run(k, k, hidden, text[:, self.fed[k] + 1 + k:length + k])
            self._after(k, out)
        else:  # recursion: the last layer reads its own output and the drafted token at the next position
            last = self.num_layers - 1
            out = self._run(last, last, self._last, text[:, -1:])
            self._last = out
        return self._logits(out)

    def _depth(self, sequence: torch.LongTensor) -> int:
        """The deepest draft after ``sequence``: ``num_tokens``, and no deeper than the text has rows for every
        layer (a prompt of one token after the prefill has two)."""
        if self.num_layers < sequence.shape[1]:
            return self.max_tokens
        return min(self.max_tokens, sequence.shape[1] - 1)

    def _end(self) -> None:
        """Crop every layer back to its verified rows (the drafted ones are recomputed once verified)."""
        for k in range(self.num_layers):
            compat.crop_cache_layer(self.cache, k, compat.cache_layer_length(self.cache, k) - self.fed[k])

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.features.lost or self.broken or self.features.known == 0:
            return DraftTree.empty(sequence.device)  # before the prefill there is no hidden state yet
        if self.static is not None:
            from .captured import static_draft

            return static_draft(self, sequence, plan)
        if self.config.tree is not None and not plan.chain_only:
            nodes = plan.tree_nodes()
            if nodes == 0:
                return DraftTree.empty(sequence.device)
            if nodes != CHAIN:
                return self._tree(sequence, nodes, plan)
        if not plan.start_chain():
            return DraftTree.empty(sequence.device)
        logits = self._begin(sequence)
        if logits is None:
            return DraftTree.empty(sequence.device)
        try:
            return draft_chain(plan, self.ctx, sequence, logits, min(plan.depth, self._depth(sequence)),
                               lambda token: self._next(sequence, token), on_device=True)
        finally:
            self._end()

    def _tree(self, sequence: torch.LongTensor, nodes: int, plan: Plan) -> DraftTree:
        """The first ``nodes`` rank paths of the tree, down to the plan's depth and ``num_tokens``: depth ``d``'s
        guesses are the ``d``-th step's ranked tokens along the chain of first guesses (point masses under either
        rule), each node ranking them processed with its own branch as the context (the call's logits processors,
        core/draft_guide.py)."""
        shape = self.config.tree
        depth = min(plan.depth, self._depth(sequence))
        paths = [p for p in shape.paths[:nodes] if len(p) <= depth]
        if not paths:
            return DraftTree.empty(sequence.device)
        logits = self._begin(sequence)
        if logits is None:
            return DraftTree.empty(sequence.device)
        if not host_chooses(self.ctx):
            return self._device_tree(sequence, paths, logits)
        guide = DraftGuide(self.ctx.logits_processor, sequence)
        levels, spine = [logits], []  # each depth's logits, along the chain of first guesses
        try:
            while len(levels) < max(len(p) for p in paths):
                token = first_guess(guide, levels[-1], spine)
                if token is None:
                    break  # the processors leave nothing to draft there
                spine.append(token)
                levels.append(self._next(sequence, token))
        finally:
            self._end()

        level = 0

        def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
            nonlocal level  # a level's nodes are expanded together, from the root's children down
            level += 1
            return levels[level].expand(len(frontier), -1)  # [k, V]: the same logits under every node of a depth

        tree = grow_paths(paths, levels[0], expand, len(levels), guide)
        return DraftTree(tree.tokens.to(sequence.device), tree.parents.to(sequence.device))

    def _device_tree(self, sequence: torch.LongTensor, paths: list, logits: torch.Tensor) -> DraftTree:
        """:meth:`_tree` without processors, on the device: the spine's first guesses fed back without a read, every
        node's guess taken at once (``grow_paths_on_device``), one read. A level after a spine guess with no
        probability gets none either (all ``-inf``): its nodes are dropped, as the host path stops there."""
        levels, alive = [logits.float()], None  # alive: [] whether every spine guess so far has a probability
        try:
            while len(levels) < max(len(p) for p in paths):
                logprobs = torch.log_softmax(levels[-1], dim=-1)
                top = logprobs.masked_fill(logprobs.isnan(), float("-inf")).topk(1)  # as first_guess ranks
                finite = top.values[0].isfinite()
                alive = finite if alive is None else alive & finite
                nxt = self._next(sequence, top.indices[0]).float()  # [V]
                levels.append(torch.where(alive, nxt, float("-inf")))
        finally:
            self._end()
        tree = grow_paths_on_device(paths, torch.stack(levels), len(levels))  # the one read
        return tree if tree.tokens.device == sequence.device else DraftTree(tree.tokens.to(sequence.device),
                                                                          tree.parents.to(sequence.device))

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Queue the target's features of the verified rows (of any drafter's tree): never a rejected branch's."""
        self.features.follow_tree(sequence.shape[1], tree.size, list(verdict.path))

    def close(self) -> None:
        self.features.close()
        if self.static is not None:
            self.static.close()
        self.cache = None
        self.carry = [None] * self.num_layers
