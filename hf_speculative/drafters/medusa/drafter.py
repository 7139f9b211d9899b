"""``hfs.Medusa``: Medusa heads (Cai et al. 2024) as a strategy and its per-call generator.

The heads read the target's normed last hidden state at the position before the newest verified token
(the state from which the target chose that token; forward hooks record it, as for EAGLE), and guess the
next ``K`` tokens at once: head ``k`` the token ``k + 1`` places after the newest. No drafter forward per
token: one step drafts a chain of every head's top guess, or a static tree of their ranked guesses
(``hfs.StaticTree``, Medusa's construction) verified in one forward by hf_speculative's loop.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from ...core import regions
from ...core.chain_drafting import device_chain_length, draft_chain, host_chooses
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, SpecFiles, example_label
from ...core.costs import draft_price, record_draft_step
from ...core.features import VerifiedFeatures
from ...options import CheckedOnAssignment, shown
from ...core.state import state_of
from ...core.tree import DraftTree, Verdict
from ...core.tree_shapes import StaticTree, grow_paths, grow_paths_on_device, kept_paths
from ...core.draft_guide import DraftGuide
from ...core.budget import Plan, Sizing
from ...core.policy import check_chain_options
from .model import MedusaHeads

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
TREE_FILE = "tree.json"  # a StaticTree calibrated on the heads' validation ranks (train-medusa writes it)


def pretrained_names() -> list[str]:
    """Targets for which trained Medusa heads ship with the package."""
    from .checkpoints import shipped_names

    return shipped_names(PRETRAINED_DIR)


def _checkpoints() -> Any:
    """The Medusa checkpoint module (imported on use)."""
    from . import checkpoints

    return checkpoints


@dataclasses.dataclass(eq=False)
class Medusa(CheckedOnAssignment, DraftStrategy, method="medusa",
             capabilities=Capabilities(trees=True, reads_target="features"), examples=("medusa", "medusa-tree"),
             live_fields=("heads",), files=SpecFiles(network="checkpoint", subfolder="medusa", checkpoints=_checkpoints,
                                                     shipped_dir=PRETRAINED_DIR)):
    """Draft with Medusa heads on the target's last hidden state.

    Args:
        heads (`MedusaHeads`): the heads (see :meth:`from_pretrained`), on the target's device and dtype.
        tree (`StaticTree`, *optional*): draft a tree of the heads' ranked guesses (depth ``d`` of a rank
            path is head ``d - 1``'s guess of that rank), verified in one forward by hf_speculative's own
            loop; ``StaticTree.calibrate`` builds one from measured ranks. ``None``: a chain of each head's
            top guess, verified by transformers' assisted loop.
        num_tokens (`int`, defaults to 8): the longest chain (at most the number of heads).
        confidence_threshold (`float`, defaults to 0.05): end a chain after a guess the head gives less than
            this probability (0 disables).
        adaptive (`bool`, defaults to `True`): chains: draft a guess only while its calibrated chance of
            acceptance pays for verifying it; trees: verify the tree, a part of it (its first half, quarter...
            of paths) or nothing, whichever the measured verification costs and kept tokens favour.
        draft_cost (`float`, *optional*): one drafting step (all heads) in target forwards; measured by default.
    """

    heads: MedusaHeads = dataclasses.field(repr=False)
    tree: StaticTree | None = None
    num_tokens: int = 8
    confidence_threshold: float = 0.05
    adaptive: bool = True
    draft_cost: float | None = None

    def __post_init__(self):
        if not isinstance(self.heads, MedusaHeads):
            raise TypeError(f"Medusa(heads=...) needs MedusaHeads (use hfs.Medusa.from_pretrained(path, target=model)), "
                            f"got {type(self.heads).__name__}.")
        check_chain_options(self)
        if self.tree is not None and not isinstance(self.tree, StaticTree):
            raise ValueError(f"Medusa(tree={shown(self.tree)}): use hfs.StaticTree(paths) (rank paths; depth d is "
                             "head d - 1's guesses), hfs.StaticTree.calibrate(...) or None for chains.")
        if self.tree is not None and self.tree.depth > self.heads.config.num_heads:
            raise ValueError(f"Medusa(tree=...): the tree is {self.tree.depth} deep but there are "
                             f"{self.heads.config.num_heads} heads (one per depth); drop the deeper rank paths.")

    @classmethod
    def from_pretrained(cls, path_or_name: str | os.PathLike, target: torch.nn.Module | None = None, *,
                        sha256: dict[str, str] | None = None, tree: StaticTree | str | None = None,
                        **options: Any) -> "Medusa":
        """Load heads: a folder in any supported layout (ours, FasterDecoding's Medusa-1/2, vLLM's) or the name
        of a target whose heads ship with hf_speculative (``hfs.Medusa.from_pretrained("smollm2-135m-instruct",
        target=model)``).

        Args:
            path_or_name (`str`): a folder, or a name from ``pretrained_names()``.
            target (`PreTrainedModel`, *optional*): the model the heads draft for; gives the device and dtype,
                and is checked against the heads (hidden size, vocabulary, depth).
            sha256 (`dict[str, str]`, *optional*): expected digests of the checkpoint's files.
            tree (`StaticTree` or ``"calibrated"``, *optional*): ``"calibrated"`` loads the tree that
                ``train-medusa`` calibrated on the heads' validation ranks (the folder's ``tree.json``).
            **options: ``num_tokens``, ``confidence_threshold``, ``adaptive``, ``draft_cost``.
        """
        from . import checkpoints

        path = checkpoints.find_folder(
            path_or_name, PRETRAINED_DIR,
            owner="Medusa.from_pretrained", argument="path_or_name",
            missing=f"No Medusa heads at {str(path_or_name)!r}: give a folder with config.json and weights (train "
            f"them with `hf-speculative train-medusa`), or one of the shipped heads {pretrained_names()}.")
        if isinstance(tree, str):
            if tree != "calibrated" or not (path / TREE_FILE).exists():
                raise ValueError(f"Medusa.from_pretrained(tree={tree!r}): 'calibrated' loads the {TREE_FILE} that "
                                 f"train-medusa writes beside the heads (none in {path} unless it says 'calibrated' "
                                 "there); otherwise pass hfs.StaticTree(paths) or None.")
            from ...registry import integrity

            what = f"Medusa.from_pretrained(tree={tree!r})"
            tree_file = checkpoints.folder_file(path, TREE_FILE, what)
            integrity.read_capped(tree_file, integrity.MAX_JSON_BYTES, what)
            tree = StaticTree.load(tree_file)  # a regular file of the folder under the cap (checked just above)
        param = None if target is None else next(target.parameters())
        heads = checkpoints.load_heads(path, dtype=None if param is None else param.dtype,
                                       target_config=None if target is None else target.config, sha256=sha256)
        if param is not None:
            heads.to(param.device)
        strategy = cls(heads=heads, tree=tree, **options)
        if target is not None:
            strategy.validate_target(target)
        return strategy

    def validate_target(self, target: torch.nn.Module) -> None:
        checked = state_of(target).checked
        if self.heads in checked:
            return
        self.heads.config.check_target(target)
        device = next(target.parameters()).device
        if next(self.heads.parameters()).device != device:
            raise ValueError(f"The Medusa heads are on {next(self.heads.parameters()).device} and the target on "
                             f"{device}; move them with strategy.heads.to({str(device)!r}).")
        checked.add(self.heads)

    def open(self, ctx: CallContext) -> "MedusaCandidateGenerator":
        return MedusaCandidateGenerator(ctx, self)

    # -- its spec (hf/spec.py) and its examples ----------------------------------------------------------
    def spec_network(self) -> MedusaHeads:
        return self.heads

    @classmethod
    def load_network(cls, method: str, folder: Any, target: torch.nn.Module) -> "Medusa":
        return cls.from_pretrained(folder, target=target)

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> "Medusa":
        return dataclasses.replace(network, **options)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "Medusa":
        """Random heads (:func:`random_heads`) drafting at every step: ``"medusa"`` chains of 4, ``"medusa-tree"`` a
        tree 3 wide at the top, so that side branches win too."""
        tree = None
        if example_label(cls, label) == "medusa-tree":
            tree = StaticTree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
        settings = {"heads": random_heads(target), "tree": tree, "num_tokens": 4, "confidence_threshold": 0.0,
                    "adaptive": False}
        return cls(**{**settings, **options})


def random_heads(target: torch.nn.Module, num_heads: int = 4, seed: int = 7, scale: float = 0.3) -> MedusaHeads:
    """Random heads shaped for ``target`` (one residual block and lm_head each, weights ~ N(0, scale): every input
    matters), seeded with ``seed``: the matrix's examples."""
    from .config import MedusaConfig

    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig.for_target(target.config, num_heads, lm_head="per_head", num_layers=1))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.to(next(target.parameters()).dtype).eval().requires_grad_(False)


class MedusaCandidateGenerator(SpeculativeCandidateGenerator):
    """Per-call state: the target's newest usable hidden state, the chain policy or the tree budget.

    Invariant between forwards: ``self.last`` `[H]` is the target's normed last hidden state at position
    ``L - 2`` (``L`` = verified length): the state from which it chose token ``L - 1``, which its lm_head
    turned into that token and head ``k`` turns into a guess of token ``L + k``.
    """

    def __init__(self, ctx: CallContext, config: Medusa):
        super().__init__(ctx)
        self.config = config
        self.heads = config.heads
        self.num_heads = self.heads.config.num_heads
        self.features = VerifiedFeatures(ctx.target, [], view=ctx.view)  # [] = the final norm's output
        self.head = ctx.target.get_output_embeddings()
        self.last: torch.Tensor | None = None
        nodes = 0 if config.tree is None else config.tree.size
        self.verify_costs = ctx.verify_costs(max(config.num_tokens, nodes))
        self.sizing = Sizing(self.verify_costs, tokens=min(config.num_tokens, self.num_heads), nodes=nodes,
                             rule="confidence", adaptive=config.adaptive,
                             confidence_threshold=config.confidence_threshold, draft_price=self._draft_price)
        self.captured = self._open_captured(ctx)

    def _open_captured(self, ctx: CallContext):
        """Whole steps as compiled regions (``captured``) when the target is compiled and nothing on the host
        chooses the tokens, else ``None``."""
        from ...core.static_cache import compiled_mode

        mode = compiled_mode(ctx.target)
        if mode is None or host_chooses(ctx):
            return None
        from .captured import HeadsRegions

        return HeadsRegions(ctx.target, self.heads, mode, ctx.vocab_size)

    def _draft_price(self) -> float:
        # one head (a small MLP and a vocabulary projection); until measured, a guess for a large target
        return draft_price(self.heads, self.verify_costs, self.config.draft_cost, 0.05)

    def _take_last(self) -> None:
        pending = self.features.pop()  # [1, P, H]
        if pending is not None:
            self.last = pending[0, -1]

    def _head_logits(self, k: int) -> torch.Tensor:
        """Head ``k``'s logits over the target's vocabulary, `[V]` (float32); each head is timed as one drafting
        step (its vocabulary projection is most of its cost)."""
        start = time.perf_counter()
        logits = self._to_target_vocab(self.heads.head_logits(self.last, k, self.head)[None])[0]  # [V]
        record_draft_step(self.heads, time.perf_counter() - start)
        return logits

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.features.lost or self.last is None:
            return DraftTree.empty(sequence.device)  # before the prefill there is no hidden state yet
        if self.config.tree is not None and not plan.chain_only:
            return self._tree(sequence, plan)
        if not plan.start_chain():
            return DraftTree.empty(sequence.device)
        tree = self._captured_chain(plan)
        if tree is not None:
            return tree
        depth = iter(range(1, self.num_heads))
        # the heads' guesses do not depend on the drafted tokens: the next head, computed only if the chain goes on
        return draft_chain(plan, self.ctx, sequence, self._head_logits(0), min(plan.depth, self.num_heads),
                           lambda token: self._head_logits(next(depth)), on_device=True)

    def _captured_chain(self, plan: Plan) -> DraftTree | None:
        """The chain in one region (``captured``): a fixed length, or under the cost rules on a device where the
        heads' extra work costs less than a read per head (the longest chain, the rules replayed after the read);
        ``None``: draft it head by head."""
        if self.captured is None:
            return None
        limit = min(plan.depth, self.num_heads)
        length, ask = device_chain_length(plan, self.ctx, limit), False
        if length is None and regions.replays_longest_chain(self.captured.regions.device):
            length, ask = plan.longest_chain(limit), True
        if not length:
            return None
        # the region of a step away from the call's end (a last step, with less room, keeps the start of its chain)
        widest = plan.region_chain(min(plan.full_depth, self.num_heads), ask)
        return self.captured.chain(self.last, plan, widest, ask, keep=length)

    def _tree(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        """One step's draft tree: the first ``nodes`` rank paths of the static tree (parents come first, so
        any prefix is a tree), down to the plan's depth and the number of heads. Head ``d``'s logits are the same
        under every node of depth ``d``; each node ranks them processed with its own branch as the context (the
        call's logits processors: a token they ban is no guess, core/draft_guide.py)."""
        nodes = plan.tree_nodes()
        depth = min(plan.depth, self.num_heads)
        paths = kept_paths(self.config.tree.paths[:nodes], depth)
        if not paths:
            return DraftTree.empty(input_ids.device)
        if self.captured is not None:
            # every head and guess in one region, one read: the region of a step away from the call's end, whose
            # paths a last step, with less room, keeps as deep as it can
            full = kept_paths(self.config.tree.paths[:nodes], min(plan.full_depth, self.num_heads))
            tree = self.captured.tree(self.last, full)
            if tree is not None:
                return tree.within(depth)
        if not host_chooses(self.ctx):  # no processors: every node's guess at once on the device, one read
            logits = torch.stack([self._head_logits(d) for d in range(max(len(p) for p in paths))])  # [D, V]
            tree = grow_paths_on_device(paths, logits, depth)
            return DraftTree(tree.tokens.to(input_ids.device), tree.parents.to(input_ids.device)) \
                if tree.tokens.device != input_ids.device else tree
        level = 0

        def expand(frontier: list[int], tokens: torch.Tensor, parents: list[int]) -> torch.Tensor:
            nonlocal level  # a level's nodes are expanded together, from the root's children down
            level += 1
            return self._head_logits(level).expand(len(frontier), -1)  # [k, V]

        tree = grow_paths(paths, self._head_logits(0), expand, depth, DraftGuide(self.ctx.logits_processor, input_ids))
        return DraftTree(tree.tokens.to(input_ids.device), tree.parents.to(input_ids.device))

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """Keep the hidden state of the newest accepted row (of any drafter's tree, e.g. in ``hfs.Hybrid``)."""
        self.features.follow_tree(sequence.shape[1], tree.size, list(verdict.path))
        self._take_last()

    def close(self):
        self.features.close()
        self.last = None
        if self.captured is not None:
            self.captured.close()
            self.captured = None
