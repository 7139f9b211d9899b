"""What the training loop reads: cached examples, the order they come in, and batches of them.

One sequence per forward (``batch_size=1``, the default) keeps a CPU busy already; an accelerator
needs several. Batches are right-padded to their longest sequence, so sequences of similar length are
grouped: each epoch shuffles the examples, sorts windows of ``64 x batch_size`` by length, cuts them
into batches and shuffles the batches. The order is a function of ``(seed, epoch)`` alone, so a
resumed run reads what an uninterrupted one would.
"""

from __future__ import annotations

import torch

from .data import FeatureCache

WINDOW = 64  # batches per length-sorted window: little padding, yet a shuffled order


class CachedExamples(torch.utils.data.Dataset):
    """``examples[indices[i]]`` with its cached target features, final states and argmax; without a
    cache (``--features online``), its tokens only, the features being computed for the whole batch."""

    def __init__(self, examples, cache: FeatureCache | None, indices: list[int]):
        self.examples, self.cache, self.indices = examples, cache, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        j = self.indices[i]
        ex = self.examples[j]
        item = {"ids": torch.tensor(ex.ids), "loss_mask": torch.tensor(ex.loss_mask)}
        if self.cache is not None:
            item["features"], item["final"], item["top"] = self.cache.get(j)
        return item


class EpochOrder(torch.utils.data.Sampler):
    """Every index of ``lengths`` once per epoch, in an order decided by ``(seed, epoch)`` alone, so a
    resumed run reads what an uninterrupted one would. Call :meth:`use_epoch` before iterating an epoch.

    With ``batch_size=1`` the order is a permutation: the one ``DataLoader(shuffle=True, generator=...)``
    seeded with ``seed`` gives epoch ``e`` of an uninterrupted run, so the shipped drafter's stages
    (trained that way) reproduce, while a resumed run no longer starts over at the first epoch's order.
    With more, consecutive runs of ``batch_size`` have similar lengths (see the module doc).

    Args:
        lengths (`list[int]`): each example's length in tokens.
        batch_size (`int`): sequences per batch.
        seed (`int`): with the epoch, decides the order.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        super().__init__()
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def use_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        n = len(self.lengths)
        if self.batch_size == 1:
            generator = torch.Generator().manual_seed(self.seed)
            for _ in range(self.epoch + 1):  # per epoch, a DataLoader's iterator draws its workers' base seed,
                torch.empty((), dtype=torch.int64).random_(generator=generator)  # then RandomSampler the
                order = torch.randperm(n, generator=generator).tolist()  # permutation, then an empty tail
                torch.randperm(n, generator=generator)
            return iter(order)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        shuffled = torch.randperm(n, generator=generator).tolist()
        size, window = self.batch_size, self.batch_size * WINDOW
        full, short = [], []
        for start in range(0, n, window):
            chunk = sorted(shuffled[start : start + window], key=lambda i: -self.lengths[i])
            for a in range(0, len(chunk), size):
                (full if a + size <= len(chunk) else short).append(chunk[a : a + size])
        batches = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()] + short
        return iter([i for batch in batches for i in batch])


def batch_generator(device: torch.device | str, seed: int, batch: int, process: int = 0) -> torch.Generator:
    """The generator of one training batch's random draws (DFlash's anchors, Medusa's positions), seeded by the run's
    ``seed``, the batch's number in the run and the process: a run resumed from a checkpoint draws what the
    uninterrupted run drew (the global generator's state there also depends on when the data loader started)."""
    mixed = (seed * 0x9E3779B97F4A7C15 + batch * 0x100000001B3 + process) % (1 << 63)
    return torch.Generator(device=device).manual_seed(mixed)


def pad_batch(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad ``items`` to the longest: ids, loss mask, features, final states and argmax `[B, T, ...]`
    (zeros past each sequence's end, never learnt); ``lengths`` `[B]` and ``tokens``, the real tokens in the batch."""
    longest = max(len(item["ids"]) for item in items)
    batch = {}
    for key in items[0]:
        first = items[0][key]
        padded = first.new_zeros((len(items), longest, *first.shape[1:]))
        for row, item in enumerate(items):
            padded[row, : len(item[key])] = item[key]
        batch[key] = padded
    batch["lengths"] = torch.tensor([len(item["ids"]) for item in items])
    batch["tokens"] = batch["lengths"].sum()
    return batch
