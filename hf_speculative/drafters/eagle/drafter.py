"""``hfs.Eagle``: the EAGLE hidden-state drafter as a strategy and its per-call generator.

The path of one call: the first target forward (the prompt's prefill) runs without a draft while
forward hooks record the target's features; from then on, every draft starts by feeding the
drafter the pairs ``(f_t, x_{t+1})`` that the last target forward verified, which also replaces
the drafter's cache entries written from its own predicted features, then continues the chain on
its own predictions until the expected gain no longer pays for drafting and verifying a token.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from ...core.chain_drafting import DraftVocab, device_chain_length, draft_chain, host_chooses
from ...core.draft_guide import DraftGuide
from ...core import regions
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import TreeOrChainCandidateGenerator, check_network_once
from ..registry import Capabilities, SpecFiles, example_label
from ...core.costs import draft_price, record_draft_step
from ...cpu.layout import follow_layout
from ...cpu.kernel import WEIGHTS
from ...core.features import VerifiedFeatures
from ...options import CheckedOnAssignment, shown
from ...core.tree import DraftTree, Verdict
from ...core.tree_shapes import (DynamicTree, StaticTree, device_tree_capacity, device_tree_levels, drafter_levels,
                                 grow_dynamic_on_device, grow_tree)
from ...core.budget import Plan
from ...core.policy import check_chain_options
from .model import DraftKVCache, EagleDraftModel
from .captured import captured_chain, captured_tree, chain_region, tree_region
from .static_drafting import frontier_width, open_static
from .tree_drafting import device_tree_expander, tree_expander

PRETRAINED_DIR = Path(__file__).parent / "pretrained"


def pretrained_names() -> list[str]:
    """Targets for which a trained drafter ships with the package."""
    from .checkpoints import shipped_names

    return shipped_names(PRETRAINED_DIR)


def _checkpoints() -> Any:
    """The EAGLE checkpoint module (imported on use: it reads every format we support)."""
    from . import checkpoints

    return checkpoints


@dataclasses.dataclass(eq=False)
class Eagle(CheckedOnAssignment, DraftStrategy, method="eagle",
            capabilities=Capabilities(trees=True, batch=True, reads_target="features"),
            examples=("eagle1", "eagle3", "eagle-tree"), live_fields=("drafter",),
            files=SpecFiles(network="checkpoint", subfolder="eagle", checkpoints=_checkpoints,
                            shipped_dir=PRETRAINED_DIR)):
    """Draft with an EAGLE network that reads the target's own hidden states.

    Args:
        drafter (`EagleDraftModel`): the network (see :meth:`from_pretrained`), on the target's
            device and dtype.
        num_tokens (`int`, defaults to 8): the longest draft.
        confidence_threshold (`float`, defaults to 0.05): stop after a token the drafter gives less
            than this probability (0 disables; the cost rule below does most of the stopping).
        adaptive (`bool`, defaults to `True`): draft a token only while the calibrated chance that
            the draft so far is accepted pays for drafting and verifying it (measured costs).
        draft_cost (`float`, *optional*): one drafter step in target forwards; measured by default.
        tree (`DynamicTree` or `StaticTree`, *optional*): draft a tree, verified in one forward by
            hf_speculative's own loop: ``hfs.DynamicTree(nodes, depth, top_k)`` grows EAGLE-2's context-aware
            tree (one drafter forward per depth over the ``top_k`` likeliest nodes, the best ``nodes`` kept);
            ``hfs.StaticTree(paths)`` drafts a fixed set of rank paths. With ``adaptive`` the node count per
            step (0 included) follows the measured verification cost and what trees kept. ``None``: chains.
        kernel_weights (`str`, defaults to `"int8"`): on a target that runs hf_speculative's CPU kernel
            (``hfs.optimize_for_cpu(target)``), what the drafter's kernel copies hold: `"int8"`, int8 weights with
            one scale per output column, a quarter of the fp32 bytes a drafter forward reads (the drafts may change
            a little, the output not at all: the target verifies them); `"exact"`, its own values. SmolLM2's shipped
            drafter on an AVX2 CPU, Spec-Bench (``benchmarks/eagle_kernel_weights.py``): a chain of 5 drafted in a
            median 8.7 ms instead of 13.9 at the same τ (1.466 against 1.469), 0.898x greedy against 0.864x; the
            default chains 1.039x against 1.023x (τ 1.216 against 1.203). Elsewhere it does nothing. The network is
            shared: the last call's setting holds for it.
    """

    drafter: EagleDraftModel = dataclasses.field(repr=False)
    num_tokens: int = 8
    confidence_threshold: float = 0.05
    adaptive: bool = True
    draft_cost: float | None = None
    tree: DynamicTree | StaticTree | None = None
    kernel_weights: str = "int8"

    def __post_init__(self):
        if not isinstance(self.drafter, EagleDraftModel):
            raise TypeError(f"Eagle(drafter=...) needs an EagleDraftModel (use hfs.Eagle.from_pretrained(path, target=model)), "
                            f"got {type(self.drafter).__name__}.")
        if self.drafter.config.exit_layer is not None:
            raise ValueError(f"This network is an exit adapter for the first {self.drafter.config.exit_layer} layers, not an "
                             f"EAGLE drafter: use hfs.EarlyExit(exit_layer={self.drafter.config.exit_layer}, adapter=path).")
        check_chain_options(self)
        if self.tree is not None and not isinstance(self.tree, (DynamicTree, StaticTree)):
            raise ValueError(f"Eagle(tree={shown(self.tree)}): use hfs.DynamicTree(nodes=..., depth=..., top_k=...), "
                             f"hfs.StaticTree(paths) or None for chains.")
        if self.kernel_weights not in WEIGHTS:
            raise ValueError(f"Eagle(kernel_weights={shown(self.kernel_weights)}): use one of {WEIGHTS}.")

    @classmethod
    def from_pretrained(cls, path_or_name: str | os.PathLike, target: torch.nn.Module | None = None, *,
                        sha256: dict[str, str] | None = None, **options: Any) -> "Eagle":
        """Load a drafter: a folder in any supported format (ours, SafeAILab EAGLE-1/2/3, SpecForge,
        vLLM speculators) or the name of a target whose drafter ships with hf_speculative
        (``hfs.Eagle.from_pretrained("smollm2-135m-instruct", target=model)``).

        Args:
            path_or_name (`str`): a folder, or a name from ``pretrained_names()``.
            target (`PreTrainedModel`, *optional*): the model it will draft for; gives the device and
                dtype, fills what a checkpoint's config leaves out, and is checked against the drafter.
            sha256 (`dict[str, str]`, *optional*): expected digests of the checkpoint's files.
            **options: ``num_tokens``, ``confidence_threshold``, ``adaptive``, ``draft_cost``.
        """
        from . import checkpoints

        path = checkpoints.find_folder(
            path_or_name, PRETRAINED_DIR,
            owner="Eagle.from_pretrained", argument="path_or_name",
            missing=f"No EAGLE drafter at {str(path_or_name)!r}: give a folder with config.json and weights (train one with "
            f"`hf-speculative train-eagle`), or one of the shipped drafters {pretrained_names()}.")
        param = None if target is None else next(target.parameters())
        net = checkpoints.load_drafter(path, dtype=None if param is None else param.dtype,
                                       target_config=None if target is None else target.config, sha256=sha256)
        net.requires_grad_(False)
        if param is not None:
            net.to(param.device)
        strategy = cls(drafter=net, **options)
        if param is not None:  # after hfs.optimize_for_cpu(target): the drafter's steps gain alike
            follow_layout(net, target, strategy.kernel_weights)
        if target is not None:
            strategy.validate_target(target)
        return strategy

    def validate_target(self, target: torch.nn.Module) -> None:
        check_network_once(target, self.drafter, self.drafter.config.check_target, "The EAGLE drafter", "drafter")

    def open(self, ctx: CallContext) -> "EagleCandidateGenerator":
        # a target laid out since from_pretrained, or another kernel_weights: the drafter follows (else nothing)
        follow_layout(self.drafter, ctx.target, self.kernel_weights)
        return EagleCandidateGenerator(ctx, self)

    # -- its spec (spec_writer.py, hf/spec.py) and its examples ----------------------------------------------------------
    def spec_network(self) -> EagleDraftModel:
        return self.drafter

    @classmethod
    def load_network(cls, method: str, folder: Any, target: torch.nn.Module) -> "Eagle":
        return cls.from_pretrained(folder, target=target)

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> "Eagle":
        return dataclasses.replace(network, **options)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "Eagle":
        """``"eagle1"`` / ``"eagle3"``: a random EAGLE-1 / EAGLE-3 network (:func:`random_drafter`) drafting chains of
        5 at every step; ``"eagle-tree"``: the EAGLE-3 one drafting trees 3 wide."""
        label = example_label(cls, label)
        if label == "eagle-tree":
            settings = {"tree": DynamicTree(nodes=8, depth=4, top_k=3), "adaptive": False}
        else:
            settings = {"num_tokens": 5, "confidence_threshold": 0.0, "adaptive": False}
        return cls(**{"drafter": random_drafter(target, version=1 if label == "eagle1" else 3), **settings, **options})


def random_drafter(target: torch.nn.Module, version: int = 3, seed: int = 7, draft_vocab_size: int | None = None,
                   exit_layer: int | None = None) -> EagleDraftModel:
    """A random EAGLE network shaped for ``target``, seeded with ``seed`` (tests and the matrix's examples). EAGLE-3
    takes a reduced vocabulary of the target's even ids by default, so that every use exercises the id map; with
    ``exit_layer``, an exit adapter for the target's first ``exit_layer`` layers (``hfs.EarlyExit(adapter=...)``)."""
    from .config import EagleConfig

    vocab = target.config.vocab_size
    if version == 3 and draft_vocab_size is None:
        draft_vocab_size = vocab // 2
    adapter = {} if exit_layer is None else {"target_layers": [exit_layer - 1], "exit_layer": exit_layer}
    torch.manual_seed(seed)
    net = EagleDraftModel(EagleConfig.for_target(target.config, version=version, draft_vocab_size=draft_vocab_size,
                                                 **adapter))
    if version == 3:
        step = 2 if draft_vocab_size <= vocab // 2 else 1
        ids = torch.arange(0, vocab, step)[:draft_vocab_size]  # target ids of the draft vocabulary
        net.d2t.copy_(ids - torch.arange(draft_vocab_size))
        net.t2d.zero_()
        net.t2d[ids] = True
    return net.to(next(target.parameters()).dtype).eval().requires_grad_(False)


class EagleCandidateGenerator(TreeOrChainCandidateGenerator):
    """Per-call state: the target's verified features, the drafter's KV cache, the length policy.

    Invariant between forwards: the drafter's cache holds positions ``[0, n_true)`` computed from
    the target's true features; ``features.pending`` holds the verified features of positions
    ``[n_true, L - 1)`` not fed yet (``L`` = verified length; position ``L - 1``, the target's
    newest token, has no feature until the next target forward).
    """

    def __init__(self, ctx: CallContext, config: Eagle):
        super().__init__(ctx)
        self.config = config
        self.net = config.drafter
        self.features = VerifiedFeatures(ctx.target, self.net.config.target_layers, view=ctx.view)
        self.embed = ctx.target.get_input_embeddings()
        self.head = ctx.target.get_output_embeddings()
        self.cache = DraftKVCache()
        self.n_true = 0
        self._target_ids = self.net.target_ids()  # [V_draft] or None
        # the drafter's own vocabulary: chains drafted on the device pick their tokens there, without widening
        self._vocab = DraftVocab.of(self._widen, ctx.vocab_size, self._target_ids)
        nodes = self._size_tree_or_chain(ctx, config)
        self.graphs = self._open_static(ctx, nodes)

    def _open_static(self, ctx: CallContext, nodes: int):
        """Fixed-shape drafting (``static_drafting``) when the target is compiled, else ``None`` (eager drafting)."""
        from ...core.static_cache import compiled_mode

        mode = compiled_mode(ctx.target)
        if mode is None:
            return None
        shape = self.config.tree
        depth = 0 if shape is None else shape.depth
        width = 1 if shape is None else frontier_width(shape)
        catch_width = max(self.config.num_tokens, depth) + 1  # a step keeps at most its draft's depth, plus one
        return open_static(ctx.target, self.net, mode, target_ids=self._target_ids, vocab_size=ctx.vocab_size,
                           max_length=ctx.max_length, catch_width=catch_width, width=width,
                           speculative=catch_width + max(self.config.num_tokens, depth * width))

    def _draft_price(self) -> float:
        # until measured: one layer against a whole model
        return draft_price(self.net, self.verify_costs, self.config.draft_cost, 0.05)

    def _widen(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's logits `[..., V_d]` over the target's vocabulary `[..., V]` (float32)."""
        return self._to_target_vocab(logits, self._target_ids)

    def _target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The drafter's logits for output states ``hidden`` `[..., H]`, over the target's vocabulary `[..., V]`."""
        return self._widen(self.net.draft_logits(hidden, self.head))

    def _catch_up(self, input_ids: torch.LongTensor, widen: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the verified pairs; the drafter's output hidden state for position ``L - 2`` `[H]` and its logits
        (what it predicts for the token after the root): over the target's vocabulary `[V]`, or with ``widen=False``
        and eager drafting over the drafter's own `[V_d]`."""
        length = input_ids.shape[1]
        tokens = input_ids[:, self.n_true + 1 : length]  # [1, P]
        if self.graphs is not None:
            hidden, logits = self.graphs.catch_up(tokens[0], self.features.pop()[0], self.n_true)
        else:
            self.cache.crop(self.n_true)  # drop the entries written from predicted features
            positions = torch.arange(self.n_true, length - 1, device=input_ids.device)[None]
            out = self.net(self.embed(tokens), self.features.pop(), positions, self.cache, fused=True)  # [1, P, H]
            hidden = out[0, -1]
            logits = self._target_logits(hidden) if widen else self.net.draft_logits(hidden, self.head)  # [V] / [V_d]
        self.n_true = length - 1
        return hidden, logits

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.features.lost or self.features.empty:
            return DraftTree.empty(sequence.device)  # before the prefill there are no features yet
        return super().draft(sequence, plan)

    def _chain(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        if not plan.start_chain():
            return DraftTree.empty(input_ids.device)
        if self.graphs is not None:
            return self._static_chain(input_ids, plan)
        hidden, logits = self._catch_up(input_ids, widen=False)  # [H], [V_d]
        hidden = hidden.view(1, 1, -1)  # [1, 1, H]: the shape the drafter takes and gives back
        device = input_ids.device
        first = input_ids.shape[1] - 1
        # [1, 1] each: one view per depth, made at once (indexing per step would be an operation per token)
        positions = iter(torch.arange(first, first + plan.depth, device=device).view(-1, 1, 1).unbind(0))

        def step(token: int | torch.Tensor) -> torch.Tensor:
            """The drafter on ``token`` (a target id: an int, or a device tensor ``[]`` on the device chain);
            its logits over its own vocabulary `[V_d]`."""
            nonlocal hidden
            start = time.perf_counter()
            ids = token.view(1, 1) if isinstance(token, torch.Tensor) else torch.tensor([[token]], device=device)
            hidden = self.net(self.embed(ids), hidden, next(positions), self.cache, fused=False)  # [1, 1, H]
            logits = self.net.draft_logits(hidden, self.head).view(-1)  # [V_d]
            record_draft_step(self.net, time.perf_counter() - start)
            return logits

        return draft_chain(plan, self.ctx, input_ids, logits, plan.depth, step, on_device=True,
                           vocab=self._vocab)

    def _captured(self, input_ids: torch.LongTensor, draft) -> DraftTree:
        """The step drafted by a captured region on the fixed-shape path: ``draft(tokens [P'], features [P', F],
        first)`` (``captured``) on the verified pairs since the last step."""
        tree = draft(input_ids[0, self.n_true + 1:], self.features.pop()[0], self.n_true)
        self.n_true = input_ids.shape[1] - 1
        return tree

    def _static_chain(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        """The chain on the fixed-shape path: one captured region where its length is fixed (``captured``), or under
        the cost rules on a device where a region's extra forwards cost less than a read per token (its longest
        length, the rules replayed after the read); else ``graphs.chain_step`` per token, with logits over the
        target's vocabulary. The region is as long as a step away from the call's end drafts (``plan.full_depth``),
        so that the last steps, with less room, keep the start of its chain instead of compiling a shorter one."""
        length = device_chain_length(plan, self.ctx, plan.depth)
        ask = (length is None and not host_chooses(self.ctx)
               and regions.replays_longest_chain(self.graphs.device))  # the cost rules, replayed
        if ask:
            length = plan.longest_chain(plan.depth)
        full = plan.region_chain(plan.full_depth, ask) if length else 0
        run = chain_region(self.graphs, full) if length else None
        if run is not None:
            return self._captured(input_ids, lambda tokens, features, first: captured_chain(
                self.graphs, run, self.net, plan, tokens, features, first, full, ask, keep=length))
        hidden, logits = self._catch_up(input_ids)  # [H], [V]
        position = input_ids.shape[1] - 1

        def step(token: int | torch.Tensor) -> torch.Tensor:
            nonlocal hidden, position
            start = time.perf_counter()
            hidden, logits = self.graphs.chain_step(token, hidden, position)
            position += 1
            record_draft_step(self.net, time.perf_counter() - start)
            return logits

        return draft_chain(plan, self.ctx, input_ids, logits, plan.depth, step, on_device=True)

    def _device_tree_ok(self) -> bool:
        """Whether this call's dynamic trees grow on the device (``grow_dynamic_on_device``): eager drafting, and
        nothing that reads the host's branches (the call's processors, a sampler)."""
        return self.graphs is None and isinstance(self.config.tree, DynamicTree) and not host_chooses(self.ctx)

    def _tree(self, input_ids: torch.LongTensor, nodes: int, plan: Plan) -> DraftTree:
        """One step's draft tree of at most ``nodes`` nodes (the ``tree=`` shape grown from the drafter's beliefs)."""
        start = time.perf_counter()
        shape = self.config.tree
        max_depth = plan.depth
        if self.graphs is not None and isinstance(shape, DynamicTree) and not host_chooses(self.ctx) and nodes > 0:
            # the region of a step away from the call's end; a last step keeps its own levels of it
            levels, keep = (device_tree_levels(shape, nodes, depth) for depth in (plan.full_depth, max_depth))
            run = tree_region(self.graphs, shape, nodes, levels,
                              device_tree_capacity(shape, nodes, plan.full_depth))
            if run is not None:
                return self._captured(input_ids, lambda tokens, features, first: captured_tree(
                    self.graphs, run, self.net, tokens, features, first, levels,
                    min(shape.top_k, self.ctx.vocab_size), keep=keep))
        hidden, logits = self._catch_up(input_ids)  # [H], [V]: what predicts the root's children
        if self._device_tree_ok():
            expand = device_tree_expander(
                self.net, self.embed, self.cache, self.n_true, input_ids.shape[1] - 1, hidden,
                self._target_logits,
                nodes=device_tree_capacity(shape, nodes, max_depth))
            tree = grow_dynamic_on_device(shape, logits, expand, nodes, max_depth)
            record_draft_step(self.net, (time.perf_counter() - start) / drafter_levels(tree))
            return tree
        if self.graphs is not None:
            expand = self.graphs.tree_expander(self.n_true, input_ids.shape[1] - 1, hidden)
        else:
            expand = tree_expander(self.net, self.embed, self.cache, self.n_true, input_ids.shape[1] - 1, hidden,
                                   self._target_logits)
        tree = grow_tree(self.config.tree, logits, expand, nodes, max_depth,
                         DraftGuide(self.ctx.logits_processor, input_ids))  # the call's processors on every node
        steps = drafter_levels(tree)
        record_draft_step(self.net, (time.perf_counter() - start) / steps)
        return tree

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Queue the target's features of the verified rows (of any drafter's tree, e.g. in ``hfs.Hybrid``)."""
        self.features.follow_tree(sequence.shape[1], tree.size, list(verdict.path))

    def close(self):
        self.features.close()
        self.cache = DraftKVCache()
        if self.graphs is not None:
            self.graphs.close()
