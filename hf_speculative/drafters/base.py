"""The two halves of every drafter: a reusable strategy and a per-call candidate generator.

A :class:`DraftStrategy` is configuration only (a self-validating dataclass, safe to share between
calls and threads). For each ``generate()`` call, :meth:`DraftStrategy.open` builds a
:class:`SpeculativeCandidateGenerator`, a transformers ``CandidateGenerator`` that holds the state
of that one call (caches, n-gram index, captured features) and is dropped afterwards.

A per-call drafter implements three methods (``draft``, ``observe``, ``close``) and declares its ``sizing``; the
loop decides how much it drafts (core/budget.py). The base class is also the adapter that runs any drafter in
transformers' own assisted loop, owning what must be right there for *every* drafter:

- the draft never runs past ``max_length`` (transformers crops there only from 5.14);
- the draft is cut at a token that would fire a stopping criterion (EOS, stop strings, custom
  criteria), because transformers checks stopping criteria only at the end of an accepted block;
- statistics are counted where the events happen.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import time
from typing import Any, ClassVar

import torch
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
)

from .. import compat
from ..core.call import CallContext  # noqa: F401 - drafters and users import it from here
from ..core.budget import CHAIN, FIXED, DraftBudget, Plan, Sizing
from ..core.tree import DraftTree, Verdict
from .registry import CHAINS_ONLY, NO_FILES, Capabilities, Drafter, SpecFiles, register


# Criteria that a draft never needs to be checked against token by token: max length is enforced
# by capping the draft, EOS by token ids, and wall time is not a property of the tokens.
_BUILTIN_CRITERIA = (MaxLengthCriteria, MaxTimeCriteria, EosTokenCriteria)


class DraftStrategy(Drafter):
    """Base of the reusable drafting strategies (``hfs.PromptLookup``, ``hfs.DraftModel``, ...).

    Subclasses are dataclasses that validate themselves in ``__post_init__`` and implement
    :meth:`open`. A strategy never holds per-call state.

    A drafter declares what it is once, in its class statement, and declaring registers it
    (:mod:`~hf_speculative.drafters.registry`)::

        class PromptLookup(CheckedOnAssignment, DraftStrategy, method="prompt-lookup",
                           capabilities=Capabilities(trees=True, batch=True)):

    ``variants=("early-exit-adapter",)`` registers further spec method names for the class (see :meth:`spec_method`).
    A subclass that declares no ``method`` is the same drafter (a variant, a wrapper by inheritance): it keeps its
    base's method and capabilities and registers nothing. A strategy that holds another one and forwards to it
    overrides :meth:`declared` to return that one's: everything reads capabilities through
    :func:`~hf_speculative.drafters.registry.capabilities_of`, never by probing attributes.
    """

    method: ClassVar[str | None] = None  # its registry name; None: not registered (e.g. a user's own strategy)
    capabilities: ClassVar[Capabilities] = CHAINS_ONLY  # what the class can do (see declared for an instance)
    name: ClassVar[str] = "strategy"  # its name in the statistics; the method by default
    examples: ClassVar[tuple[str, ...]] = ()  # labels of its instances in the test matrix (see example)
    # its spec in generation_config.json, read by hf/spec.py (see the spec_ methods below)
    live_fields: ClassVar[tuple[str, ...]] = ()  # init fields holding objects (a network, a model), never options
    spec_files: ClassVar[SpecFiles] = NO_FILES  # what its spec keeps in files beside the model
    holds_members: ClassVar[bool] = False  # its spec lists its members' specs ("members"), not options

    def __init_subclass__(cls, method: str | None = None, capabilities: Capabilities | None = None,
                          variants: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if capabilities is not None:
            if not isinstance(capabilities, Capabilities):
                raise TypeError(f"{cls.__qualname__}(capabilities=...) takes a registry.Capabilities, got "
                                f"{type(capabilities).__name__}.")
            cls.capabilities = capabilities
        if method is None:
            if variants:
                raise TypeError(f"{cls.__qualname__}(variants=...) needs method=...")
            return
        cls.method = method
        if "name" not in cls.__dict__:
            cls.name = method
        register(cls, (method, *variants))

    def __new__(cls, *args: Any, **kwargs: Any) -> "DraftStrategy":
        # a mistyped option (PromptLookup(num_token=3)) names the close match, not dataclasses' bare TypeError
        if kwargs and dataclasses.is_dataclass(cls):
            known = [f.name for f in dataclasses.fields(cls) if f.init]
            for key in kwargs:
                if key not in known:
                    close = difflib.get_close_matches(key, known, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    raise TypeError(f"{cls.__name__}() got an unknown option {key!r}: {hint}"
                                    f"its options are {', '.join(known)}.")
        return super().__new__(cls)

    def open(self, ctx: CallContext) -> "SpeculativeCandidateGenerator":  # pragma: no cover - abstract
        raise NotImplementedError

    def validate_target(self, target: torch.nn.Module) -> None:
        """Raise a clear error if this strategy cannot serve ``target`` (device, vocabulary...)."""

    # -- what it can do -----------------------------------------------------------------------------
    def declared(self) -> Capabilities:
        """What this strategy can do as configured: its class's capabilities, with ``trees`` only when it drafts
        trees (its ``tree`` setting is not ``None``; a strategy configured for chains declares none)."""
        capabilities = type(self).capabilities
        if capabilities.trees and getattr(self, "tree", None) is None:
            return dataclasses.replace(capabilities, trees=False)
        return capabilities

    def draft_budget(self) -> int | None:
        """The most draft tokens one step proposes: its tree's ``nodes`` (a ``StaticTree``'s paths), else its
        ``num_tokens``; ``None`` when it does not say."""
        tree = getattr(self, "tree", None)
        if tree is not None:
            return int(getattr(tree, "nodes", None) or len(tree.paths))
        tokens = getattr(self, "num_tokens", None)
        return None if tokens is None else int(tokens)

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options: Any) -> "DraftStrategy":
        """The test matrix's instance ``label`` (one of :attr:`examples`; default the first) for the tiny random model
        ``target``: it drafts there at every step (random networks shaped for ``target``, no confidence cut, fixed
        lengths). ``options`` replace its settings."""
        raise NotImplementedError(f"{cls.__qualname__} declares no example for the test matrix.")

    # -- as a model's default drafter, in its GenerationConfig (see spec.py) ------------------------
    def spec_method(self) -> str | None:
        """The method name its spec records: the class's ``method`` (or one of its ``variants``, by settings)."""
        return type(self).method

    @classmethod
    def files_for(cls, method: str) -> SpecFiles:
        """What the spec of ``method`` (one of the class's names) keeps in files: :attr:`spec_files` by default."""
        return cls.spec_files

    def spec_path(self) -> str | None:
        """The spec's ``path`` as far as it is known without writing files (``None``: none)."""
        return None

    def spec_network(self) -> Any:
        """The network its spec names (``spec_files.network``): a trained network to save, or the draft model."""
        return None

    def spec_members(self) -> list[tuple["DraftStrategy", str]] | None:
        """``(member, label)`` of a strategy whose spec lists members (:attr:`holds_members`), else ``None``."""
        return None

    @classmethod
    def load_network(cls, method: str, folder: Any, target: torch.nn.Module) -> Any:
        """What a ``"checkpoint"`` spec's ``folder`` holds, loaded for ``target`` (hf/spec.py has checked the folder:
        confined to the model's, digests matched); handed to :meth:`from_spec_options`."""
        raise NotImplementedError(f"{cls.__qualname__} loads no network.")

    @classmethod
    def from_spec_options(cls, method: str, options: dict, network: Any = None) -> "DraftStrategy":
        """The strategy a spec of ``method`` describes: its checked ``options`` and the ``network`` loaded for it (a
        checkpoint's, :meth:`load_network`, or a draft model), if its spec names one."""
        return cls(**options)

    @classmethod
    def from_spec_members(cls, members: list["DraftStrategy"]) -> "DraftStrategy":
        """A strategy whose spec lists members (:attr:`holds_members`), built from them."""
        return cls(*members)

    def to_dict(self) -> dict:
        """The JSON spec of this strategy (``{"method": ..., "options": {...}, ...}``), without writing files.

        transformers calls ``to_dict()`` on the dataclasses a ``GenerationConfig`` holds when it prints,
        hashes, compares or saves it, so a config holding a strategy stays serializable."""
        from ..hf import spec

        return spec.to_spec(self)

    def save_pretrained(self, save_directory: str | os.PathLike) -> dict:
        """Write what this strategy needs beside a model saved in ``save_directory`` and return its spec
        for ``generation_config.json``: a trained network (``Eagle``, ``EarlyExit(adapter=...)``) goes to a
        subfolder (``eagle/``, ``exit-adapter/``) unless it ships with hf_speculative; a draft model is
        named (registry name, folder or Hub id), not copied. ``model.save_pretrained(dir)`` on an enabled
        model whose ``generation_config.candidate_generator`` holds the strategy calls this itself."""
        from ..hf import spec

        return spec.save_strategy(self, save_directory)

    def __deepcopy__(self, memo: dict) -> "DraftStrategy":
        # A strategy is shared, read-only configuration (one instance serves many calls and threads).
        # transformers deep-copies the GenerationConfig holding it in every generate() call: share it,
        # rather than copy a drafter network or a draft model each time.
        return self


class SpeculativeCandidateGenerator(compat.CandidateGenerator):
    """A per-call drafter: what ``strategy.open(ctx)`` returns for one ``generate()`` call.

    The protocol, all a drafter implements (hf_speculative's loop calls it; see core/loop.py)::

        sizing                                   # declared in __init__: how it drafts (core/budget.Sizing)
        draft(sequence, plan) -> DraftTree       # a chain is a tree with one branch
        observe(sequence, tree, verdict, scores) # every verified forward, its own draft or not
        close()                                  # once, when the call ends, even on error

    How much to draft is the loop's decision: ``plan`` (a :class:`~hf_speculative.core.budget.Plan`) says how deep
    the draft may go and answers the drafter's questions (its node budget, whether the next token pays, how many
    copied tokens pay); the loop learns from each verdict. A drafter keeps only its own state (caches, indexes,
    features) and measures its own forwards (``record_draft_step``).

    The same object is a transformers ``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``
    below): the adapter through which transformers' own assisted loop runs any of our drafters (chains only, as
    that loop verifies chains), with the same sizing, max-length cap and cuts at stopping tokens.

    Args:
        ctx (`CallContext`): the call this drafter serves.
    """

    sizing: Sizing = FIXED  # a drafter that sizes its drafts by the cost model declares its own in __init__

    def __init__(self, ctx: CallContext):
        self.ctx = ctx
        self.stats = ctx.stats
        self._eos = compat.eos_token_ids(ctx.generation_config)
        self._eos_tensor = torch.tensor(self._eos, dtype=torch.long) if self._eos else None
        self._custom_criteria = [c for c in (ctx.stopping_criteria or []) if not isinstance(c, _BUILTIN_CRITERIA)]
        self._adapter: tuple[DraftBudget, Plan | None, DraftTree] | None = None  # transformers' loop's step
        self._proposed_at = 0.0
        self.draft_logits: torch.Tensor | None = None  # [k, V]: logits a user's generator drafted from, if any

    # -- what a drafter implements ----------------------------------------------------------
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        """This step's draft after ``sequence`` (`[1, L]`, verified), within ``plan`` (at most ``plan.depth`` deep;
        a chain when ``plan.chain_only``). Empty: a plain decoding step."""
        raise NotImplementedError

    def observe(self, sequence: torch.LongTensor, tree: DraftTree, verdict: Verdict, scores: torch.Tensor) -> None:
        """After every verifying forward: ``sequence`` is the verified text after it (the target's own token
        included), ``tree`` what was verified (this drafter's draft, or another's in ``hfs.Hybrid``), ``verdict``
        its outcome and ``scores`` `[1 + n, V]` the forward's processed target logits. Keep the per-call state in
        step (caches, captured hidden states); the sizing rules learn in the loop."""

    def close(self) -> None:
        """Free per-call resources (hooks, caches). Called once when the call ends, even on error."""

    @property
    def prompt_length(self) -> int | None:
        """The call's prompt length (without padding), once the call started, else ``None``."""
        return self.ctx.prompt_length

    @property
    def after_prefill(self) -> bool:
        """True once the target's forwards are decoding steps (the first one also prefilled the prompt)."""
        return self.stats.target_forwards > 1

    # -- transformers' CandidateGenerator interface: the adapter ------------------------------
    def get_candidates(self, input_ids: torch.LongTensor, *args: Any, **kwargs: Any):
        """Returns the full sequence `[1, L+k]` and the candidate logits `[1, k, V]` or ``None``."""
        first_call = self._adapter is None
        if first_call:
            if self.ctx.prompt_length is None:
                self.ctx.prompt_length = input_ids.shape[1]
            budget = DraftBudget(self.sizing)
        else:
            budget = self._adapter[0]
        start = time.perf_counter()
        # Leave room for the target's own token: L + k + 1 <= max_length.
        room = self.ctx.max_length - input_ids.shape[1] - 1
        plan, tree, logits = budget.plan(max(room, 1), chain_only=True), DraftTree.empty(input_ids.device), None
        if room > 0:
            self.draft_logits = None
            tree = self.draft(input_ids, plan).first_branch().first(room)
            keep = self._length_before_stop(input_ids, tree.tokens.to(input_ids.device)) if tree.size else 0
            tree, logits = tree.first(keep), self.draft_logits
            if logits is None and tree.q is not None:  # drawn from q under the rejection rule: transformers reads q
                logits = tree.q.clamp_min(1e-30).log()
            logits = None if logits is None or keep == 0 else logits[:keep]
        if tree.size == 0 and first_call and room > 0 and self._prompt_already_stopped(input_ids):
            # transformers < 5.18 drops the last candidate when the candidate sequence already
            # satisfies a stopping criterion, and with no candidate at all that drops the target's
            # own token. One filler candidate keeps the target's token whatever it is (accepted or
            # not, the loop appends exactly the target's choice).
            tree, logits = DraftTree.chain(input_ids[0, -1:]), None
        self._adapter = (budget, plan, tree)
        self.stats.record_draft(tree.size, time.perf_counter() - start)
        self._proposed_at = time.perf_counter()
        if tree.size == 0:
            return input_ids, None
        candidates = torch.cat([input_ids, tree.tokens.to(input_ids.device)[None, :]], dim=-1)  # [1, L+k]
        if logits is not None:
            logits = self._to_target_vocab(logits)[None].to(input_ids.device)  # [1, k, V]
        return candidates, logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: Any) -> None:
        budget, plan, tree = self._adapter
        accepted = min(int(num_matches), tree.size)
        seconds = time.perf_counter() - self._proposed_at
        self.stats.record_verify(accepted, seconds)
        self.stats.new_tokens = input_ids.shape[1] - (self.prompt_length or input_ids.shape[1])
        verdict = Verdict(tuple(range(accepted)), int(input_ids[0, -1]))
        # (the prefill's forward is not a verification: it says nothing of verify costs)
        budget.verified(plan, tree, verdict, seconds if self.after_prefill else None)
        self.observe(input_ids, tree, verdict, scores[0] if scores is not None and scores.dim() == 3 else scores)

    # -- helpers ----------------------------------------------------------------------------
    def _length_before_stop(self, input_ids: torch.LongTensor, tokens: torch.Tensor) -> int:
        """Number of draft tokens to keep so that no stopping criterion fires inside the block.

        The draft is cut *before* the stopping token: the target produces it itself if it chooses it, a
        choice that is deterministic under greedy decoding and under seeded sampling alike (see accept.py).
        """
        limit = tokens.numel()
        if self._eos_tensor is not None:
            hits = torch.isin(tokens, self._eos_tensor.to(tokens.device)).nonzero()
            if hits.numel():
                limit = int(hits[0])
        if self._custom_criteria and limit > 0:
            sequence = torch.cat([input_ids, tokens[None, :limit]], dim=-1)
            base = input_ids.shape[1]
            for i in range(1, limit + 1):
                if any(compat.stopping_result(c(sequence[:, : base + i], None)) for c in self._custom_criteria):
                    return i - 1
        return limit

    def _prompt_already_stopped(self, input_ids: torch.LongTensor) -> bool:
        """Whether a stopping criterion already holds for the prompt itself (e.g. it ends with EOS),
        on versions whose loop then mishandles an empty draft."""
        if not compat.HAS_IS_DONE_CANDIDATE_RULE or not self.ctx.stopping_criteria:
            return False
        return compat.stopping_result(self.ctx.stopping_criteria(input_ids, None))

    def _to_target_vocab(self, logits: torch.Tensor, target_ids: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`to_target_vocab` at this call's vocabulary width."""
        return to_target_vocab(logits, self.ctx.vocab_size, target_ids)


def to_target_vocab(logits: torch.Tensor, width: int, target_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Pad (with -inf) or cut a drafter's logits `[k, V_d]` (float32) to the target's width `[k, V]`; with
    ``target_ids`` `[V_d]` (a reduced draft vocabulary: the target id of every draft id), place each
    draft logit at its target id and -inf everywhere else."""
    logits = logits.float()
    if target_ids is not None:
        full = logits.new_full((*logits.shape[:-1], width), float("-inf"))
        full[..., target_ids] = logits
        return full
    if logits.shape[-1] == width:
        return logits
    if logits.shape[-1] > width:
        return logits[..., :width]
    pad = logits.new_full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def check_network_once(target: torch.nn.Module, network: torch.nn.Module, check, name: str, field: str) -> None:
    """A strategy's ``validate_target`` for a drafter with its own network: ``check(target)`` (raises where the
    network does not fit the target), then the same device as the target's, once per (target, network) pair (the
    target's state remembers it). ``name`` (e.g. ``"The EAGLE drafter"``) and ``field`` (the strategy's attribute
    holding the network) word the device error."""
    from ..core.state import state_of

    checked = state_of(target).checked
    if network in checked:
        return
    check(target)
    device = next(target.parameters()).device
    if next(network.parameters()).device != device:
        raise ValueError(f"{name} is on {next(network.parameters()).device} and the target on "
                         f"{device}; move it with strategy.{field}.to({str(device)!r}).")
    checked.add(network)


class TreeOrChainCandidateGenerator(SpeculativeCandidateGenerator):
    """A per-call drafter that grows trees with ``tree=`` and whose own chain is one more option of the loop's tree
    budget (``Sizing(..., chain_option=True)``: EAGLE, draft models). Subclasses implement ``_tree(sequence, nodes,
    max_depth)`` and ``_chain(sequence, plan)``; ``config.tree`` is the strategy's shape (``None``: chains)."""

    @torch.no_grad()
    def draft(self, sequence: torch.LongTensor, plan: Plan) -> DraftTree:
        if self.config.tree is not None:
            nodes = plan.tree_nodes()
            if nodes == 0:
                return DraftTree.empty(sequence.device)
            if nodes != CHAIN:
                return self._tree(sequence, nodes, plan.depth)
        return self._chain(sequence, plan)

    def _size_tree_or_chain(self, ctx: CallContext, config: Any) -> int:
        """Set ``self.verify_costs`` and ``self.sizing`` for ``config.tree`` (or chains of ``config.num_tokens``),
        ``config.adaptive``, ``config.confidence_threshold`` and ``self._draft_price``: the confidence rule, the chain
        one more option of the tree budget, one drafter step per tree depth. Returns the tree's nodes (0: chains)."""
        from ..core.tree_shapes import DynamicTree, tree_depth

        nodes = 0 if config.tree is None else (
            config.tree.nodes if isinstance(config.tree, DynamicTree) else config.tree.size)
        self.verify_costs = ctx.verify_costs(max(config.num_tokens, nodes))
        self.sizing = Sizing(self.verify_costs, tokens=config.num_tokens, nodes=nodes, rule="confidence",
                             adaptive=config.adaptive, confidence_threshold=config.confidence_threshold,
                             draft_price=self._draft_price, chain_option=True,
                             draft_steps=None if config.tree is None else (lambda m: tree_depth(config.tree, m)))
        return nodes


class ExternalCandidateGenerator(SpeculativeCandidateGenerator):
    """Adapts a user's raw ``CandidateGenerator`` instance: it gets the same max-length cap,
    stopping cuts and statistics as the built-in drafters."""

    def __init__(self, ctx: CallContext, inner: Any):
        super().__init__(ctx)
        self.inner = inner

    def draft(self, sequence, plan):
        candidates, logits = self.inner.get_candidates(sequence)
        tokens = candidates[0, sequence.shape[1]:][: plan.depth]  # [k]
        self.draft_logits = None if logits is None else logits[0, : tokens.numel()]
        return DraftTree.from_tokens(tokens.tolist(), sequence.device)

    def observe(self, sequence, tree, verdict, scores):
        update = getattr(self.inner, "update_candidate_strategy", None)
        if update is not None:
            try:
                update(sequence, scores[None], verdict.num_accepted)
            except NotImplementedError:  # the abstract base raises before 5.18
                pass
