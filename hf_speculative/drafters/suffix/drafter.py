"""SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; snowflakedb/ArcticInference): model-free tree drafts
from suffix tries over this call's text and the model's earlier outputs.

Two tries, as in the paper: one over this call's prompt and output (grown token by token), one over the
outputs the same model generated before in this process (:mod:`.suffix_history`, bounded, shared by threads,
optionally kept in a file). At each step the last tokens are matched in both; from the matched node, the
likeliest continuations (counted frequencies, best first) form the draft tree, whose size grows with the match
length (``spec_factor * length + spec_offset`` nodes, at most ``max_nodes``): a long match predicts well, a
one-token match hardly. Of the two tries' trees the one with the higher expected accepted length is verified.
With ``adaptive`` the tree is then cut to the node count whose expected accepted tokens (the nodes' path
probabilities, calibrated against what verification really kept) pay most for the measured cost of verifying
them on this hardware (``costs.py``), 0 when none pays. Prompt lookup is its special case without history,
one branch.
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch

from ... import options
from ...core.call import CallContext
from ..strategy import DraftStrategy
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, SpecFiles, example_label

from ...options import CheckedOnAssignment
from ...core.budget import Plan, Sizing
from ...core.tree import DraftTree
from ...core.tree_shapes import DynamicTree
from .history import HISTORY_NODE_BYTES, MAX_HISTORY_FILE_BYTES, SuffixHistory, add_output, history_for
from .tree import SuffixTrie, best_speculation

MAX_HISTORY_TOKENS = 10_000_000  # the history's trie holds up to ``max_depth`` nodes per token
MAX_HISTORY_NODES = 1 << 24  # ``history_tokens * max_depth``: the nodes the history's trie may reach
MAX_CONTEXT_TOKENS = 10_000_000


def _fingerprint(target: torch.nn.Module) -> str:
    """The model identity a spec's history file is kept under in the package's cache (as LayerSkip's calibration)."""
    from ..self_speculative.calibration import model_fingerprint

    return model_fingerprint(target)


@dataclasses.dataclass
class SuffixDecoding(CheckedOnAssignment, DraftStrategy, method="suffix", capabilities=Capabilities(trees=True),
                     examples=("suffix",),
                     # a history file in a spec: a name inside the model's folder, kept in the package's cache per model
                     files=SpecFiles(file_option="history_file", saved_name="suffix-history.json",
                                     max_bytes=MAX_HISTORY_FILE_BYTES, fingerprint=_fingerprint)):
    """Draft trees from suffix tries over the call's text and the model's earlier outputs (SuffixDecoding).

    Runs in hf_speculative's own tree loop (greedy or seeded sampling, lossless either way).

    Args:
        max_depth (`int`, defaults to 24): the longest substring the tries keep (1-64); a match of ``m`` tokens
            leaves continuations up to ``max_depth - m`` deep. Memory: up to ``max_depth`` trie nodes per token.
        max_nodes (`int`, defaults to 24): the most draft tokens verified per step (1-256).
        spec_factor (`float`, defaults to 1.0): a match of ``m`` tokens drafts at most
            ``floor(spec_factor * m + spec_offset)`` nodes (0-64).
        spec_offset (`float`, defaults to 0.0): see ``spec_factor`` (-64 to 64).
        min_token_prob (`float`, defaults to 0.1): a node's path probability (product of the frequency ratios
            down its path) must reach this to be drafted (0-1).
        history_tokens (`int`, defaults to 100_000): tokens of the model's earlier outputs kept per model in this
            process (0: no history, only the call's own text); ``history_tokens * max_depth`` is at most
            ``MAX_HISTORY_NODES`` (16.7M), and the history's trie is kept under ``MAX_HISTORY_BYTES`` (1 GiB,
            estimated), the oldest outputs forgotten first.
        history_file (`str`, *optional*): a JSON file the history is loaded from when first used (if it exists;
            a regular file of at most 64 MiB) and written to after every call. In a saved spec, a name inside the
            model's folder (the file is then kept in hf_speculative's cache; see docs/hosting.md).
        context_tokens (`int`, defaults to 65_536): the call's own trie indexes its last ``context_tokens``
            tokens (prompt and output); older ones are forgotten as the text grows.
        adaptive (`bool`, defaults to `True`): verify the first ``n`` nodes (best first) that maximise
            ``(1 + expected accepted tokens) / cost(n)``, with the measured verification cost ``cost(n)`` of this
            target (0 when no ``n`` pays); ``False`` verifies the whole tree.
    """

    max_depth: int = 24
    max_nodes: int = 24
    spec_factor: float = 1.0
    spec_offset: float = 0.0
    min_token_prob: float = 0.1
    history_tokens: int = 100_000
    history_file: str | os.PathLike | None = None
    context_tokens: int = 65_536
    adaptive: bool = True

    def __post_init__(self):
        owner = "SuffixDecoding"
        self.max_depth = options.check_int(owner, "max_depth", self.max_depth, 1, options.MAX_TREE_DEPTH)
        self.max_nodes = options.check_int(owner, "max_nodes", self.max_nodes, 1, options.MAX_TREE_NODES)
        self.spec_factor = options.check_number(owner, "spec_factor", self.spec_factor, 0.0, 64.0)
        self.spec_offset = options.check_number(owner, "spec_offset", self.spec_offset, -64.0, 64.0)
        self.min_token_prob = options.check_number(owner, "min_token_prob", self.min_token_prob, 0.0, 1.0)
        self.history_tokens = options.check_int(owner, "history_tokens", self.history_tokens, 0, MAX_HISTORY_TOKENS)
        self.history_file = options.check_optional_path(owner, "history_file", self.history_file)
        self.context_tokens = options.check_int(owner, "context_tokens", self.context_tokens, self.max_depth,
                                                MAX_CONTEXT_TOKENS)
        self.adaptive = options.check_bool(owner, "adaptive", self.adaptive)
        if self.history_tokens * self.max_depth > MAX_HISTORY_NODES:
            raise options.OptionError(
                f"SuffixDecoding(history_tokens={self.history_tokens}, max_depth={self.max_depth}): the history's trie "
                f"could reach history_tokens * max_depth = {self.history_tokens * self.max_depth:,} nodes (about "
                f"{HISTORY_NODE_BYTES} bytes each), over the bound of {MAX_HISTORY_NODES:,}; lower history_tokens "
                f"(at most {MAX_HISTORY_NODES // self.max_depth:,} at this depth) or max_depth.")
        if self.history_file is not None and self.history_tokens == 0:
            raise options.OptionError(f"SuffixDecoding(history_file={options.shown(self.history_file)}, "
                                      f"history_tokens=0): a history file needs a history; give history_tokens > 0 "
                                      f"or no history_file.")

    @property
    def tree(self) -> DynamicTree:
        """Its trees' bounds (it always drafts trees, so it always runs in hf_speculative's loop)."""
        return DynamicTree(nodes=self.max_nodes, depth=self.max_depth, top_k=1)

    def node_budget(self, match_length: int) -> int:
        """Nodes a match of ``match_length`` tokens may draft: ``floor(spec_factor * m + spec_offset)``, capped."""
        return max(0, min(self.max_nodes, math.floor(self.spec_factor * match_length + self.spec_offset)))

    def open(self, ctx: CallContext) -> "SuffixCandidateGenerator":
        return SuffixCandidateGenerator(ctx, self)

    def private(self) -> "SuffixDecoding":
        """Without its history of the model's earlier outputs in this process (``history_tokens=0``), which would let
        one caller's drafts (and so its τ and target forwards) follow another's answers; a history the operator keeps
        in a file (``history_file``) stays."""
        if self.history_tokens and self.history_file is None:
            return dataclasses.replace(self, history_tokens=0)
        return self

    @classmethod
    def example(cls, target: torch.nn.Module, label: str | None = None, **options) -> "SuffixDecoding":
        """``"suffix"``: no history across calls (every test's drafts come from its own call's text alone), the whole
        tree verified."""
        example_label(cls, label)
        return cls(**{"history_tokens": 0, "adaptive": False, **options})

    def history(self, target) -> SuffixHistory | None:
        """``target``'s history of outputs for these settings (``None`` with ``history_tokens=0``)."""
        if not self.history_tokens:
            return None
        return history_for(target, self.max_depth, self.history_tokens, self.history_file)


class SuffixCandidateGenerator(SpeculativeCandidateGenerator):
    """One call of :class:`SuffixDecoding`: the call's trie, the model's history, the node budget."""

    def __init__(self, ctx: CallContext, config: SuffixDecoding):
        super().__init__(ctx)
        self.config = config
        self.local = SuffixTrie(config.max_depth)
        self.tokens: list[int] = []  # the call's text, as indexed
        self._forgotten = 0  # tokens[:_forgotten] left the call's trie (context_tokens)
        self.history = config.history(ctx.target) if ctx.target is not None else None
        self.sizing = Sizing(ctx.verify_costs(config.max_nodes), tokens=config.max_depth, rule="scored",
                             adaptive=config.adaptive)
        self._sequence: torch.LongTensor | None = None
        self.last_match = (0, "none")  # (match length, "call" / "history" / "none") of the last draft

    def _index(self, input_ids: torch.LongTensor) -> None:
        new = input_ids[0, len(self.tokens):].tolist()
        self.tokens += new
        self.local.extend(new)
        depth, limit = self.config.max_depth, self.config.context_tokens
        while len(self.tokens) - self._forgotten > limit:  # the oldest start leaves the call's trie
            start = self._forgotten
            self.local.remove_path(self.tokens[start: start + depth])
            self._forgotten += 1

    def draft(self, input_ids: torch.LongTensor, plan: Plan) -> DraftTree:
        """The best speculation tree of the call's text or the model's history, best first (a loop that verifies
        chains takes its first branch, the likeliest path), as many nodes as the loop's rule says pay."""
        self._index(input_ids)
        self._sequence = input_ids
        config, max_depth = self.config, plan.depth
        budget = config.node_budget

        depth, max_match = min(max_depth, config.max_depth), config.max_depth - 1
        best = best_speculation(self.local, self.local.open_matches(max_match), budget, depth, config.min_token_prob)
        where = "call"
        if self.history is not None:
            other = self.history.speculate(self.tokens[-max_match:], max_match, budget, depth, config.min_token_prob)
            if sum(other[3]) > sum(best[3]):
                best, where = other, "history"
        length, tokens, parents, probs = best
        keep = plan.prefix_size(probs)
        tokens, parents = tokens[:keep], parents[:keep]  # best first: every prefix is a tree
        self.last_match = (length, where if tokens else "none")
        if not tokens:
            return DraftTree.empty(input_ids.device)
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=input_ids.device),
                         torch.tensor(parents, dtype=torch.long, device=input_ids.device))

    def observe(self, sequence, tree, verdict, scores):
        self._sequence = sequence

    def close(self) -> None:
        """The call's output joins the model's history (if the call generated anything; at the end of an
        ``outputs_held`` block if one runs)."""
        if self.history is None or self._sequence is None or self.prompt_length is None:
            return
        output = self._sequence[0, self.prompt_length:].tolist()
        if output:
            add_output(self.ctx.target, self.history, output)
