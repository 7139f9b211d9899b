"""How a drafter shapes its tree: ``hfs.StaticTree`` (fixed rank paths) and ``hfs.DynamicTree`` (EAGLE-2).

A *rank path* names a node by the ranks of its tokens among the drafter's guesses at each depth:
``(0,)`` is the drafter's top guess for the next token, ``(1,)`` its runner-up, ``(0, 2)`` the third
guess after the top one. A static tree is a set of rank paths (Medusa's construction), the same at
every step; :meth:`StaticTree.calibrate` picks the ``nodes`` paths most often on the target's path in
measured data. A dynamic tree (EAGLE-2) is grown per step from the drafter's own confidence: expand the
``top_k`` likeliest nodes of each depth, then keep the ``nodes`` drafted nodes of highest cumulative
probability (:meth:`DynamicTree.grow`).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
import math
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from ..options import (
    MAX_TOP_K,
    MAX_TREE_DEPTH,
    MAX_TREE_NODES,
    OptionError,
    OptionTypeError,
    as_int,
    bounded_items,
    shown,
)
from ..options import check_int as _check_int
from .draft_guide import DraftGuide, branch_of
from .tree import ROOT, DraftTree

MAX_NODES = MAX_TREE_NODES  # the widest tree any shape may ask one forward to verify
MAX_DEPTH = MAX_TREE_DEPTH
MAX_RANK = MAX_TOP_K - 1  # a rank path's largest rank: the drafter ranks its top MAX_TOP_K guesses
_SCAN_LIMIT = 4 * MAX_NODES  # items of a paths list read at most (duplicates allowed up to there)
RankPath = tuple[int, ...]


def _rank_path(path: object) -> RankPath:
    """One rank path as a tuple of ints: 1 to ``MAX_DEPTH`` integer ranks from 0 to ``MAX_RANK``."""
    items = bounded_items(path, MAX_DEPTH + 1)  # an oversize path is not read whole
    ranks = None if items is None else [as_int(r) for r in items]
    if not ranks or len(ranks) > MAX_DEPTH or any(r is None or not 0 <= r <= MAX_RANK for r in ranks):
        wrong_type = ranks is None or any(r is None for r in ranks)
        raise (OptionTypeError if wrong_type else OptionError)(
            f"StaticTree: rank path {shown(path)} must hold 1 to {MAX_DEPTH} integer ranks from 0 to {MAX_RANK}.")
    return tuple(ranks)


def _rank_paths(paths: object) -> tuple[RankPath, ...]:
    """The distinct rank paths of ``paths``, by depth then rank. Refused once more than ``MAX_NODES``
    distinct ones are seen, or more than a few times that many items, before the rest is read."""
    items = bounded_items(paths, _SCAN_LIMIT + 1)
    if items is None:
        raise OptionTypeError(f"StaticTree(paths={shown(paths)}): must be a list of rank paths such as "
                              "[(0,), (1,), (0, 0)].")
    distinct: set[RankPath] = set()
    for path in items:
        distinct.add(_rank_path(path))
        if len(distinct) > MAX_NODES or len(items) > _SCAN_LIMIT:
            raise OptionError(f"StaticTree: give 1 to {MAX_NODES} rank paths, got more than {MAX_NODES}.")
    if not distinct:
        raise OptionError(f"StaticTree: give 1 to {MAX_NODES} rank paths, got 0.")
    return tuple(sorted(distinct, key=lambda p: (len(p), p)))


@dataclasses.dataclass(frozen=True)
class StaticTree:
    """A fixed set of rank paths, every path's parent included.

    Args:
        paths: rank paths such as ``[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]``; order does not matter.
    """

    paths: tuple[RankPath, ...]

    def __post_init__(self) -> None:
        paths = _rank_paths(self.paths)
        known = set(paths)
        for path in paths:
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"StaticTree: rank path {path} lacks its parent {path[:-1]}; add it.")
        object.__setattr__(self, "paths", paths)

    @classmethod
    def chain(cls, length: int) -> StaticTree:
        """The drafter's top guess at every depth: a chain of ``length``."""
        _check_int("StaticTree.chain", "length", length, 1, MAX_DEPTH)
        return cls(tuple((0,) * i for i in range(1, length + 1)))

    @classmethod
    def calibrate(cls, target_paths: Iterable[RankPath], nodes: int) -> StaticTree:
        """The best static tree of ``nodes`` nodes for measured data (Medusa's construction).

        ``target_paths``: for every measured step, the ranks of the target's own tokens among the drafter's
        guesses along the true path (``benchmarks/tree_potential.py`` computes them). A tree keeps the
        longest prefix of such a path it contains, so a node is worth how often its path is a prefix of the
        target's: nodes are added in that order, each after its parent.
        """
        _check_int("StaticTree.calibrate", "nodes", nodes, 1, MAX_NODES)
        counts = collections.Counter(p[:i] for p in target_paths for i in range(1, len(p) + 1))
        if not counts:
            raise ValueError("StaticTree.calibrate: no measured rank paths to calibrate from.")
        children: dict[RankPath, list[RankPath]] = collections.defaultdict(list)
        for path in counts:
            children[path[:-1]].append(path)
        chosen: list[RankPath] = []
        frontier = [(-counts[p], p) for p in children[()]]
        heapq.heapify(frontier)
        while frontier and len(chosen) < nodes:
            _, path = heapq.heappop(frontier)
            chosen.append(path)
            for child in children[path]:
                heapq.heappush(frontier, (-counts[child], child))
        return cls(tuple(chosen))

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def top_k(self) -> int:
        """The most guesses any node needs from the drafter (the largest rank + 1)."""
        return 1 + max(max(p) for p in self.paths)

    def parents(self) -> list[int]:
        """Each path's parent index in :attr:`paths` order (``-1``: a child of the root)."""
        index = {p: i for i, p in enumerate(self.paths)}
        return [ROOT if len(p) == 1 else index[p[:-1]] for p in self.paths]

    def kept(self, target_path: RankPath) -> int:
        """Draft tokens this tree keeps when the target's path has these ranks (for calibration)."""
        depth, paths = 0, set(self.paths)
        while depth < len(target_path) and target_path[: depth + 1] in paths:
            depth += 1
        return depth

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps({"static_tree": [list(p) for p in self.paths]}) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> StaticTree:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("static_tree"), list):
            raise ValueError(f"{path}: not a StaticTree file (expected {{\"static_tree\": [[0], [1], [0, 0], ...]}}).")
        return cls(data["static_tree"])  # checked (types, sizes) by __post_init__


PROPOSAL_TOKENS = 256  # under the rejection rule a dynamic tree's guesses are drawn from the drafter's top ones


@dataclasses.dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's context-aware tree, grown per step from the drafter's confidence.

    Args:
        nodes (`int`, defaults to 32): draft tokens verified per target forward (the budget, 1-256).
        depth (`int`, defaults to 6): drafter forwards per step (the deepest level, 1-64).
        top_k (`int`, defaults to 8): guesses per expanded node, and nodes expanded per depth (1-64).
    """

    nodes: int = 32
    depth: int = 6
    top_k: int = 8

    def __post_init__(self) -> None:
        # frozen: the checked values (a numpy integer becomes an int) are set through object.__setattr__
        object.__setattr__(self, "nodes", _check_int("DynamicTree", "nodes", self.nodes, 1, MAX_NODES))
        object.__setattr__(self, "depth", _check_int("DynamicTree", "depth", self.depth, 1, MAX_DEPTH))
        object.__setattr__(self, "top_k", _check_int("DynamicTree", "top_k", self.top_k, 1, MAX_TOP_K))

    def grow(self, root_logits: torch.Tensor, expand: Callable[[list[int], torch.Tensor, list[int]], torch.Tensor],
             nodes: int | None = None, depth: int | None = None, sampler=None,
             guide: DraftGuide | None = None) -> DraftTree:
        """Grow one step's tree.

        Args:
            root_logits: ``[V]`` the drafter's logits (or log-probabilities) for the token after the root.
            expand: ``expand(frontier, tokens, parents)`` runs the drafter one depth further on the frontier's
                nodes (indices into the nodes drafted so far, in drafting order, with their ``[k]`` tokens and
                their parents' indices, ``-1`` for the root) and returns ``[k, V]`` logits (or log-probabilities)
                for each one's next token.
            nodes: this step's budget (defaults to ``self.nodes``; the cost model may lower it).
            depth: this step's deepest level (defaults to ``self.depth``; less near the length limit).
            sampler: a ``RejectionSampler`` when there is no ``guide`` (the guide's sampler otherwise).
            guide: the call's :class:`~hf_speculative.core.draft_guide.DraftGuide`: every node's logits go through
                the call's processors with the node's branch as the context before its guesses are chosen (a guess
                they ban is dropped); under the rejection rule a node's guesses are its top one, then draws without
                replacement (Gumbel-top-k with the sampler's generator) from the processed distribution over its
                ``PROPOSAL_TOKENS`` (256) likeliest tokens, in the order drawn, the tree keeping what each was drawn
                from (``DraftTree.q``).

        Each depth adds the ``top_k`` guesses of each frontier node; the next frontier is the ``top_k``
        new nodes of highest cumulative log-probability (the product of the guesses' probabilities along
        the path, the drafter's estimate that the path is kept). The tree keeps the ``nodes`` drafted
        nodes of highest cumulative score: a child never scores above its parent, so a kept node's
        ancestors are kept too. Drawn guesses score no higher than the sibling drawn before them, so the kept
        siblings of a node are always the first ones drawn (what the rule for draws without replacement needs).
        """
        budget = min(self.nodes if nodes is None else nodes, MAX_NODES)
        if budget <= 0:
            return DraftTree.empty(root_logits.device)
        guide = guide if guide is not None else DraftGuide(sampler=sampler)
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        dists: list[tuple] = []  # under the rejection rule: what each node was drawn from (_drawn_from)
        guesses = self._guesses(guide.logprobs(root_logits[None], [[]]), guide)
        frontier = self._add(tokens, parents, scores, [ROOT], [0.0], guesses, dists)
        for _ in range(1, min(self.depth, depth or self.depth)):
            if not frontier:
                break  # every guess banned: nothing to grow from
            logits = expand(frontier, torch.tensor([tokens[i] for i in frontier], dtype=torch.long),
                            [parents[i] for i in frontier])  # [k, V]
            branches = [branch_of(tokens, parents, i) for i in frontier]  # each node's context: its own branch
            guesses = self._guesses(guide.logprobs(logits, branches), guide)  # [k, top_k] each
            frontier = self._add(tokens, parents, scores, frontier, [scores[i] for i in frontier], guesses, dists)
        if not tokens:
            return DraftTree.empty(root_logits.device)
        keep = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:budget]
        keep.sort()  # drafting order is topological: parents were drafted first
        where = {old: new for new, old in enumerate(keep)}
        q = _drawn_from([dists[i] for i in keep]) if dists else None
        return DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.long),
                         torch.tensor([ROOT if parents[i] == ROOT else where[parents[i]] for i in keep],
                                      dtype=torch.long), q)

    def _guesses(self, logprobs: torch.Tensor, guide: DraftGuide) -> tuple:
        """Each row's ``top_k`` guesses ``(values [k, top_k], tokens [k, top_k], drawn)`` from its processed
        ``logprobs``: the guide's ranking (:meth:`~hf_speculative.core.draft_guide.DraftGuide.ranked`), or under the
        rejection rule draws without replacement (the Gumbel-top-k trick: the order of ``logprobs + g`` is a
        sequential draw), ``drawn`` then holding for each guess what it was drawn from (``_drawn_from`` builds the
        kept nodes' rows; ``None`` otherwise); a guess's value is capped at the one before it."""
        sampler = guide.rejection
        if sampler is None:
            return (*guide.ranked(logprobs, self.top_k), None)
        k = min(self.top_k, logprobs.shape[-1])
        # The draws come from the drafter's distribution over its PROPOSAL_TOKENS likeliest tokens, renormalised:
        # what each guess was drawn from is what the rule is told (so it stays exact); noise for a few hundred
        # tokens instead of the whole vocabulary, and no guesses from a tail the target never keeps.
        top = logprobs.topk(min(PROPOSAL_TOKENS, logprobs.shape[-1]), dim=-1)  # [k, M], best first
        uniform = torch.rand(top.values.shape, generator=sampler.generator).clamp_min(1e-20)
        perturbed = top.values - torch.log(-torch.log(uniform))  # [k, M]
        perturbed[:, 0] = float("inf")  # the first guess is the drafter's top one
        order = top.indices.gather(-1, perturbed.topk(k, dim=-1).indices)  # [k, top_k]: then draws w/o replacement
        values = torch.cummin(logprobs.gather(-1, order), dim=-1).values  # never above the sibling drawn before
        probs = torch.zeros_like(logprobs).scatter_(-1, top.indices, torch.softmax(top.values, dim=-1))  # [k, V]
        drawn = [[(probs, row, tokens[:i], tokens[i]) for i in range(len(tokens))]
                 for row, tokens in enumerate(order.tolist())]
        return values, order, drawn

    def _add(self, tokens, parents, scores, frontier, base, guesses, dists) -> list[int]:
        """Append each frontier node's guesses but the banned ones (value ``-inf``: the processors leave them no
        probability), with what each was drawn from under the rejection rule; return the next frontier (the
        ``top_k`` best new nodes)."""
        values, indices, drawn = guesses
        first = len(tokens)
        values, indices = values.tolist(), indices.tolist()  # one read each (on a GPU, a sync each)
        for row, parent in enumerate(frontier):
            for i, (value, token) in enumerate(zip(values[row], indices[row])):
                if not math.isfinite(value):
                    continue
                tokens.append(int(token))
                parents.append(parent)
                scores.append(base[row] + float(value))
                if drawn is not None:
                    dists.append(drawn[row][i])
        new = range(first, len(tokens))
        return sorted(sorted(new, key=lambda i: (-scores[i], i))[: self.top_k])


def _drawn_from(drawn: list[tuple]) -> torch.Tensor:
    """``[n, V]``: the distribution each guess was drawn from, for ``drawn`` entries ``(probs [k, V], row, the
    row's guesses before it, its token)``: a row's first guess is its argmax (a one-hot row, a point mass), a later
    one a draw from the row's ``probs`` less the guesses before it, renormalised. Built for the kept nodes only, in
    a few operations (not a ``[V]`` clone for every guess of every expanded node)."""
    rows = torch.stack([probs[row] for probs, row, _, _ in drawn])  # [n, V]
    before = [(i, token) for i, (_, _, earlier, _) in enumerate(drawn) for token in earlier]
    if before:
        rows[[i for i, _ in before], [t for _, t in before]] = 0.0
    q = rows / rows.sum(dim=-1, keepdim=True)
    first = [i for i, (_, _, earlier, _) in enumerate(drawn) if not earlier]
    if first:
        q[first] = torch.nn.functional.one_hot(torch.tensor([drawn[i][3] for i in first], device=q.device),
                                               q.shape[-1]).to(q.dtype)
    return q


def shape_to_json(shape: DynamicTree | StaticTree) -> dict:
    """A tree shape as JSON (for ``generation_config.json``): ``{"dynamic_tree": {...}}`` or
    ``{"static_tree": [[0], [1], [0, 0]]}``."""
    if isinstance(shape, DynamicTree):
        return {"dynamic_tree": dataclasses.asdict(shape)}
    return {"static_tree": [list(p) for p in shape.paths]}


def shape_from_json(value: object) -> DynamicTree | StaticTree:
    """The inverse of :func:`shape_to_json`; a ``ValueError`` naming the expected form otherwise."""
    if isinstance(value, dict) and set(value) == {"dynamic_tree"} and isinstance(value["dynamic_tree"], dict):
        return DynamicTree(**value["dynamic_tree"])
    if isinstance(value, dict) and set(value) == {"static_tree"} and isinstance(value["static_tree"], list):
        return StaticTree(value["static_tree"])  # checked (types, sizes) by __post_init__
    raise ValueError(f"a tree shape is {{\"dynamic_tree\": {{\"nodes\": 32, \"depth\": 6, \"top_k\": 8}}}} or "
                     f"{{\"static_tree\": [[0], [1], [0, 0]]}}, got {value!r}.")


def grow_static(shape: "StaticTree", root_logits: torch.Tensor, expand, max_depth: int,
                guide: DraftGuide | None = None) -> DraftTree:
    """Fill a static tree's rank paths with the drafter's guesses, one drafter forward per depth (over the
    nodes that have children in the tree), down to ``max_depth`` (:func:`grow_paths`)."""
    return grow_paths(shape.paths, root_logits, expand, max_depth, guide)


def grow_paths(paths: Sequence[RankPath], root_logits: torch.Tensor, expand, max_depth: int,
               guide: DraftGuide | None = None) -> DraftTree:
    """The tree of rank ``paths`` (parents before children, every path's parent among them) down to ``max_depth``:
    node ``p + (r,)`` is the guess of rank ``r`` after node ``p`` (``expand`` and ``root_logits`` as in
    :meth:`DynamicTree.grow`). With a ``guide`` each node's guesses are ranked on its logits processed with its own
    branch as the context; a rank the processors leave no guess for (banned tokens) drops its node and the nodes
    under it."""
    guide = guide if guide is not None else DraftGuide()
    paths = [p for p in paths if len(p) <= max_depth]  # sorted by depth: parents first
    if not paths:
        return DraftTree.empty(root_logits.device)
    index = {p: i for i, p in enumerate(paths)}
    parents = [ROOT if len(p) == 1 else index[p[:-1]] for p in paths]
    has_children = {p[:-1] for p in paths if len(p) > 1}
    top_k = 1 + max(max(p) for p in paths)
    ranked: dict[RankPath, list[int]] = {(): _ranked(guide, root_logits[None], [[]], top_k)[0]}
    tokens: list[int | None] = [None] * len(paths)
    for depth in range(1, 1 + max(len(p) for p in paths)):
        level = [i for i, p in enumerate(paths) if len(p) == depth]
        for i in level:
            guesses = ranked.get(paths[i][:-1], [])  # (none when the parent was dropped)
            if paths[i][-1] < len(guesses):
                tokens[i] = guesses[paths[i][-1]]
        frontier = [i for i in level if tokens[i] is not None and paths[i] in has_children]
        if frontier:
            branch = [branch_of(tokens, parents, i) for i in frontier]
            logits = expand(frontier, torch.tensor([tokens[i] for i in frontier], dtype=torch.long),
                            [parents[i] for i in frontier])  # [k, V]
            for i, top in zip(frontier, _ranked(guide, logits, branch, top_k)):
                ranked[paths[i]] = top
    keep = [i for i, token in enumerate(tokens) if token is not None]
    where = {old: new for new, old in enumerate(keep)}
    return DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.long),
                     torch.tensor([ROOT if parents[i] == ROOT else where[parents[i]] for i in keep], dtype=torch.long))


def grow_paths_on_device(paths: Sequence[RankPath], level_logits: torch.Tensor, max_depth: int) -> DraftTree:
    """:func:`grow_paths` without a guide, for a drafter whose guesses at a depth are the same under every branch
    (Medusa's heads, DFlash's block): ``level_logits`` `[D, V]`, row ``d`` the logits of every node at depth
    ``d + 1`` (at least as many rows as the deepest path kept). Every node's guess is taken at once on the device and
    read once with whether it has a probability; a node without one (banned, NaN) is dropped with the nodes under
    it, as :func:`grow_paths` drops them."""
    paths = kept_paths(paths, max_depth)
    if not paths:
        return DraftTree.empty(level_logits.device)
    return tree_from_paths(paths, *path_guesses(paths, level_logits))


def kept_paths(paths: Sequence[RankPath], max_depth: int) -> list[RankPath]:
    """The rank paths no deeper than ``max_depth`` (still parents first)."""
    return [p for p in paths if len(p) <= max_depth]


def path_guesses(paths: Sequence[RankPath], level_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`grow_paths_on_device` up to its read, with no read at all (what a captured draft step runs): each
    path's guess `[n]` and whether it has a probability `[n]` (long), for :func:`tree_from_paths`. ``paths``
    (non-empty, :func:`kept_paths`) are constants of the shape."""
    device = level_logits.device
    top_k = min(1 + max(max(p) for p in paths), level_logits.shape[-1])
    logprobs = torch.log_softmax(level_logits[: max(len(p) for p in paths)].float(), dim=-1)  # [D, V]
    top = logprobs.masked_fill(logprobs.isnan(), float("-inf")).topk(top_k, dim=-1)  # [D, R] best first
    where = torch.tensor([[len(p) - 1 for p in paths], [min(p[-1], top_k - 1) for p in paths]], device=device)
    tokens = top.indices[where[0], where[1]]  # [n] each node's guess
    finite = top.values[where[0], where[1]].isfinite()  # [n]
    if any(p[-1] >= top_k for p in paths):  # ranked past a vocabulary this small: no such guess
        finite &= torch.tensor([p[-1] < top_k for p in paths], device=device)
    return tokens, finite.long()


def tree_from_paths(paths: Sequence[RankPath], tokens: torch.Tensor, finite: torch.Tensor) -> DraftTree:
    """The tree of :func:`path_guesses`' nodes, in one read of the device: a node without a probability (or ranked
    past the vocabulary) is dropped with the nodes under it."""
    device = tokens.device
    token_list, finite_list = torch.stack([tokens, finite]).tolist()  # the one read
    index = {p: i for i, p in enumerate(paths)}
    kept: dict[int, int] = {}  # old node -> new
    parent_list: list[int] = []
    for i, p in enumerate(paths):
        parent = ROOT if len(p) == 1 else kept.get(index[p[:-1]])
        if finite_list[i] and parent is not None:
            kept[i] = len(parent_list)
            parent_list.append(parent)
    if not parent_list:
        return DraftTree.empty(device)
    if len(kept) == len(paths):
        return DraftTree._built(tokens, torch.tensor(parent_list, device=device), token_list, parent_list)
    token_list = [token_list[i] for i in kept]
    return DraftTree._built(torch.tensor(token_list, device=device), torch.tensor(parent_list, device=device),
                            token_list, parent_list)


def _ranked(guide: DraftGuide, logits: torch.Tensor, branches: list, top_k: int) -> list[list[int]]:
    """Each row's guesses best first (:meth:`~hf_speculative.core.draft_guide.DraftGuide.ranked`), the banned ones
    left out."""
    values, order = guide.ranked(guide.logprobs(logits, branches), top_k)
    return [[t for t, v in zip(row, vals) if math.isfinite(v)] for row, vals in zip(order.tolist(), values.tolist())]


def tree_depth(shape: "DynamicTree | StaticTree", nodes: int) -> int:
    """The levels a tree of ``shape`` grows to with a budget of ``nodes``: the drafter forwards it takes. A dynamic
    tree of ``m`` nodes keeps no node deeper than ``m`` levels (a kept node's ancestors are kept), so it is grown
    no deeper than that; a static tree has the depth of its deepest rank path."""
    if isinstance(shape, DynamicTree):
        return max(1, min(shape.depth, nodes))
    return max(len(path) for path in shape.paths)


def grow_tree(shape: "DynamicTree | StaticTree", root_logits: torch.Tensor, expand, nodes: int,
              max_depth: int, guide: DraftGuide | None = None) -> DraftTree:
    """One step's tree of ``shape`` with a budget of ``nodes`` (dynamic trees), no deeper than ``max_depth``: what
    EAGLE, DFlash and draft models grow from their root logits and ``expand`` (see :meth:`DynamicTree.grow`).
    ``guide``: the call's :class:`~hf_speculative.core.draft_guide.DraftGuide` (its processors on every node's
    branch; under the rejection rule a dynamic tree's guesses are drawn, while a static tree's rank paths stay
    deterministic guesses: a shape may keep rank 2 without rank 1, which draws cannot)."""
    if isinstance(shape, DynamicTree):
        return shape.grow(root_logits, expand, nodes=nodes, depth=min(max_depth, tree_depth(shape, nodes)),
                          guide=guide)
    return grow_static(shape, root_logits, expand, max_depth, guide)


def drafter_levels(tree: DraftTree) -> int:
    """The drafter forwards a grown tree took: one per level (1 for an empty tree), to price one step of it."""
    if not tree.size:
        return 1
    depth: list[int] = []  # from the structure the tree keeps on the host (no read of the device)
    for parent in tree.parent_list():
        depth.append(0 if parent == ROOT else depth[parent] + 1)
    return max(depth) + 1


def device_tree_levels(shape: DynamicTree, nodes: int, max_depth: int) -> int:
    """The levels :func:`grow_dynamic_on_device` grows (as ``grow_tree`` bounds ``DynamicTree.grow``)."""
    return min(shape.depth, max_depth, tree_depth(shape, nodes))


def device_tree_capacity(shape: DynamicTree, nodes: int, max_depth: int) -> int:
    """The most nodes :func:`grow_dynamic_on_device` drafts: the root's ``top_k`` guesses, then ``top_k`` guesses
    under each of the ``top_k`` frontier nodes at every further level (an expander sizes its buffers by it)."""
    return shape.top_k * (1 + max(device_tree_levels(shape, nodes, max_depth) - 1, 0) * shape.top_k)


def grow_dynamic_on_device(shape: DynamicTree, root_logits: torch.Tensor, expand, nodes: int,
                           max_depth: int) -> DraftTree:
    """:meth:`DynamicTree.grow` without a guide (no processors, greedy guesses) as tensor operations: no read of the
    device until the tree is made (one read of its tokens, parents and scores together). Node ``i`` is the ``i``-th
    guess in drafting order, as in ``grow``; each depth adds every frontier node's ``top_k`` guesses, the next
    frontier is the ``top_k`` new nodes of highest cumulative log-probability (ties to the earlier node, as ``grow``'s
    sort), the tree keeps the best ``nodes``. ``expand(frontier [W], tokens [W], parents [W], depth) -> [W, V]``
    takes device tensors (node indices, ``-1`` for the root) and the frontier's depth (0: the root's children).
    A guess with no probability (a NaN or infinite drafter output) scores ``-inf``: it is dropped when the tree is
    made, with its descendants, which ``grow`` never adds."""
    if min(nodes, MAX_NODES) <= 0:
        return DraftTree.empty(root_logits.device)
    return tree_from_device(*grow_dynamic_tensors(shape, root_logits, expand, nodes, max_depth))


def grow_dynamic_tensors(shape: DynamicTree, root_logits: torch.Tensor, expand, nodes: int,
                         max_depth: int, keep_levels: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`grow_dynamic_on_device` up to its read, with no read at all (what a captured draft step runs): the kept
    nodes' tokens `[m]`, their parents `[m]` (indices among the kept nodes, ``-1`` the root) and whether each has a
    probability `[m]` (long), for :func:`tree_from_device`. ``nodes`` must be positive. ``keep_levels``: a device
    scalar below the levels grown (a call's last steps, whose room is shorter than the region's): the nodes are
    chosen among the first ``keep_levels`` levels only, deeper ones scored ``-inf`` (and so dropped when the tree is
    made), which is the tree grown to that depth (the frontiers of the first levels do not depend on the depth)."""
    device = root_logits.device
    budget = min(nodes, MAX_NODES)
    k = min(shape.top_k, root_logits.shape[-1])
    scores, tokens = _top_guesses(root_logits[None], k)  # [1, k] each
    tokens, scores = tokens.reshape(-1), scores.reshape(-1)  # [k]: the root's children
    parents = torch.full_like(tokens, ROOT)
    levels = torch.zeros_like(tokens)  # [n] each node's level (0: the root's children)
    frontier = _best(scores, shape.top_k)  # [W]
    for level in range(1, device_tree_levels(shape, nodes, max_depth)):
        values, guesses = _top_guesses(expand(frontier, tokens[frontier], parents[frontier], level - 1), k)  # [W, k]
        first = tokens.numel()
        new = (scores[frontier][:, None] + values).reshape(-1)  # [W * k]: cumulative log-probabilities
        tokens = torch.cat([tokens, guesses.reshape(-1)])
        parents = torch.cat([parents, frontier.repeat_interleave(k, output_size=frontier.numel() * k)])
        scores = torch.cat([scores, new])
        levels = torch.cat([levels, torch.full_like(new, level, dtype=torch.long)])
        frontier = first + _best(new, shape.top_k)
    if keep_levels is not None:
        scores = scores.masked_fill(levels >= keep_levels, float("-inf"))
    keep = _best(scores, budget)  # [m] ascending: drafting order is topological
    where = torch.full_like(tokens, ROOT)
    where[keep] = torch.arange(keep.numel(), device=device)
    kept_parents = parents[keep]
    kept_parents = torch.where(kept_parents == ROOT, kept_parents, where[kept_parents.clamp_min(0)])
    return tokens[keep], kept_parents, scores[keep].isfinite().long()


def tree_from_device(tokens: torch.Tensor, parents: torch.Tensor, finite: torch.Tensor) -> DraftTree:
    """The tree of :func:`grow_dynamic_tensors`' nodes, in one read of the device. A node with no probability (a NaN
    or infinite drafter output) is dropped with its descendants, which ``DynamicTree.grow`` never adds."""
    device = tokens.device
    token_list, parent_list, finite_list = torch.stack([tokens, parents, finite]).tolist()  # the one read
    if all(finite_list):
        return DraftTree._built(tokens, parents, token_list, parent_list)
    # (rare: a drafter output with no probability) keep the finite nodes, whose ancestors are all finite
    index = {old: new for new, old in enumerate(i for i, ok in enumerate(finite_list) if ok)}
    pairs = [(t, ROOT if p == ROOT else index[p]) for t, p, ok in zip(token_list, parent_list, finite_list) if ok]
    if not pairs:
        return DraftTree.empty(device)
    return DraftTree(torch.tensor([t for t, _ in pairs], device=device), torch.tensor([p for _, p in pairs], device=device))


def _top_guesses(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` best guesses of the drafter's ``logits`` ``[W, V]``: ``([W, k]`` log-probabilities (``-inf``
    for none), ``[W, k]`` tokens), best first, as ``DraftGuide.ranked`` gives them."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = logprobs.masked_fill(logprobs.isnan(), float("-inf")).topk(k, dim=-1)
    return top.values, top.indices


def _best(scores: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the ``count`` highest ``scores`` ``[n]``, ties to the lower index, in ascending order."""
    order = torch.sort(scores, descending=True, stable=True).indices[:count]
    return torch.sort(order).values
