"""Training on several sequences per forward (``--batch-size``): a padded batch's loss and gradients are
the mean of its sequences' own, the order of each epoch depends on the seed and the epoch alone
(so resuming is exact), and one sequence per forward keeps the order earlier runs were trained in."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hf_speculative.cli.main import app
from hf_speculative.core.features import FeatureTap
from hf_speculative.training.batches import EpochOrder, pad_batch
from hf_speculative.training.losses import eagle_loss
from tests.conftest import build_model, random_eagle


def example(target, net, length: int, prompt: int, seed: int) -> dict[str, torch.Tensor]:
    """One cached example as the dataset gives it: ids, loss mask (the answer after ``prompt`` tokens),
    the target's features, final states and argmax."""
    torch.manual_seed(seed)
    ids = torch.randint(4, target.config.vocab_size, (length,))
    taps = FeatureTap(target, net.config.target_layers), FeatureTap(target, [])
    with torch.no_grad():
        logits = target(input_ids=ids[None]).logits
    features, final = (tap.take()[0] for tap in taps)
    for tap in taps:
        tap.remove()
    mask = torch.tensor([0] * (prompt - 1) + [1] * (length - prompt) + [0])
    return {"ids": ids, "loss_mask": mask, "features": features, "final": final, "top": logits[0].argmax(-1)}


@pytest.mark.parametrize("version", [1, 3])
def test_a_padded_batch_is_the_mean_of_its_sequences(version):
    target = build_model("llama", layers=4).requires_grad_(False)
    net = random_eagle(target, version=version).requires_grad_(True).train()
    embed, head = target.get_input_embeddings(), target.get_output_embeddings().weight
    items = [example(target, net, 14, 5, 1), example(target, net, 22, 9, 2), example(target, net, 9, 3, 3)]
    steps = 3

    def loss_and_grads(batch):
        net.zero_grad()
        loss, metrics = eagle_loss(net, embed, head, batch["ids"], batch["loss_mask"], batch["features"],
                                   batch["final"], steps, target_top=batch["top"])
        loss.backward()
        return loss.detach(), metrics, [p.grad.clone() for p in net.parameters()]

    singles = [loss_and_grads(pad_batch([item])) for item in items]
    batch = pad_batch(items)
    assert batch["ids"].shape == (3, 22) and int(batch["tokens"]) == 14 + 22 + 9
    assert not batch["loss_mask"][0, 14:].any() and not batch["features"][2, 9:].any()  # padding is never learnt
    loss, metrics, grads = loss_and_grads(batch)
    torch.testing.assert_close(loss, sum(s[0] for s in singles) / 3)
    for g, *single in zip(grads, *(s[2] for s in singles)):
        torch.testing.assert_close(g, sum(single) / 3, rtol=1e-4, atol=1e-6)
    for j in range(steps):  # the agreement is counted over every scored position of the batch
        assert metrics.counts[j] == sum(s[1].counts[j] for s in singles) > 0
        agreed = sum(s[1].accuracy[j] * s[1].counts[j] for s in singles)
        assert metrics.accuracy[j] == pytest.approx(agreed / metrics.counts[j])


def test_one_sequence_per_forward_keeps_the_order_earlier_runs_trained_in():
    """The shipped drafter was shuffled by ``DataLoader(shuffle=True, generator=...)``; EpochOrder gives
    each epoch that loader's order, from the epoch number alone."""
    loader = torch.utils.data.DataLoader(list(range(23)), shuffle=True, generator=torch.Generator().manual_seed(5),
                                         collate_fn=lambda b: b[0])
    expected = [list(loader) for _ in range(3)]
    order = EpochOrder([1] * 23, 1, seed=5)
    for epoch in (2, 0, 1):
        order.use_epoch(epoch)
        assert list(order) == expected[epoch]


def test_batches_group_similar_lengths_in_a_seeded_order():
    lengths = [int(x) for x in torch.randint(8, 400, (1000,), generator=torch.Generator().manual_seed(0))]
    order = EpochOrder(lengths, 8, seed=0)
    epochs = []
    for epoch in range(2):
        order.use_epoch(epoch)
        epochs.append(list(order))
        assert sorted(epochs[-1]) == list(range(1000))  # every example once
        order.use_epoch(epoch)
        assert list(order) == epochs[-1]  # the same seed and epoch, the same order
    assert epochs[0] != epochs[1]
    assert list(EpochOrder(lengths, 8, seed=1)) != epochs[0]

    def padded(indices):  # tokens after padding every batch of 8 to its longest
        return sum(8 * max(lengths[i] for i in indices[a : a + 8]) for a in range(0, len(indices), 8))

    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()
    assert padded(epochs[0]) < 0.8 * padded(shuffled)
    assert padded(epochs[0]) < 1.1 * sum(lengths)


ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


# resumption is accelerate's and ours: the target's forward that it trains on is test_train_cli's on both versions
@pytest.mark.single_version
@pytest.mark.parametrize("batch", [1, 3])
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, chat_checkpoint, chat_answers, batch):
    """Running the finished command again resumes from its last checkpoint, before the end, and
    trains the last steps again: with the same order of sequences, it ends on the same weights."""
    out = tmp_path / "drafter"
    args = ["train-eagle", "--target", str(chat_checkpoint), "--data", str(chat_answers), "--out", str(out),
            "--draft-vocab-size", "24", "--grad-accum", "1", "--batch-size", str(batch), "--eval-every", "4",
            "--val-prompts", "1", "--threads", "1", "--lr", "1e-2", "--epochs", "2"]
    first = CliRunner().invoke(app, args, env=ENV)
    assert first.exit_code == 0, first.output
    weights = load_file(out / "model.safetensors")
    steps = json.loads((out / "training_summary.json").read_text())["optimizer_steps"]
    assert steps == (38 if batch == 1 else 14)  # 19 sequences (2 held out) per epoch, in batches of 3: 7
    again = CliRunner().invoke(app, args, env=ENV)
    assert again.exit_code == 0, again.output
    assert f"resumed from {out / 'checkpoint'} at optimizer step {steps - steps % 4}" in again.output
    for name, value in load_file(out / "model.safetensors").items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0, msg=name)


@pytest.mark.single_version  # our checkpoint's key names, whatever transformers' version
def test_a_checkpoint_of_the_older_layout_resumes(tmp_path, chat_checkpoint, chat_answers):
    """Before the loss ran inside the module accelerate wraps, checkpoints held the drafter's weights
    without the wrapper's ``net.`` prefix; such a checkpoint resumes to the same weights."""
    from safetensors.torch import save_file

    ends = {}
    for layout in ("current", "older"):
        out = tmp_path / layout
        args = ["train-eagle", "--target", str(chat_checkpoint), "--data", str(chat_answers), "--out", str(out),
                "--draft-vocab-size", "24", "--grad-accum", "1", "--eval-every", "4", "--val-prompts", "1",
                "--threads", "1", "--lr", "1e-2"]
        assert CliRunner().invoke(app, [*args, "--epochs", "1"], env=ENV).exit_code == 0
        saved = out / "checkpoint" / "model.safetensors"
        weights = load_file(saved)
        assert weights and all(k.startswith("net.") for k in weights)
        if layout == "older":
            save_file({k.removeprefix("net."): v for k, v in weights.items()}, saved)
        resumed = CliRunner().invoke(app, [*args, "--epochs", "2"], env=ENV)
        assert resumed.exit_code == 0, resumed.output
        assert "resumed from" in resumed.output
        ends[layout] = load_file(out / "model.safetensors")
    for name, value in ends["current"].items():
        torch.testing.assert_close(ends["older"][name], value, rtol=0, atol=0, msg=name)
