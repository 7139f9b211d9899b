"""``hf-speculative self-distill`` / ``train-eagle`` / ``export-eagle`` end to end on a tiny saved
chat model: answers generated, features cached, a drafter trained, validated, saved, resumed,
exported, reloaded, and exact when it drafts."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

import hf_speculative as hfs
from hf_speculative.cli.main import app
from tests.training.conftest import CLI_ENV as ENV
from tests.training.conftest import assert_drafts_exactly
from tests.training.conftest import run_cli as run


@pytest.mark.parametrize("version", ["--eagle3", "--eagle1"])
def test_train_eagle_end_to_end(tmp_path, chat_checkpoint, prompts, version):
    out = tmp_path / "drafter"
    common = ["train-eagle", "--target", chat_checkpoint, "--prompts", prompts, "--distill-tokens", 16, "--out", out,
              version, "--draft-vocab-size", 24, "--grad-accum", 1, "--eval-every", 10, "--val-prompts", 2,
              "--threads", 1]
    run(*common, "--epochs", 1)
    distilled = [json.loads(line) for line in (out / "self_distill.jsonl").read_text().splitlines()]
    assert len(distilled) == 24 and all(r["response_tokens"] for r in distilled)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log and all(1.0 <= r["val_tau"] <= 7.0 for r in log)
    assert len(log[-1]["val_acc"]) == (4 if version == "--eagle3" else 1)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["optimizer_steps"] == 22 and summary["tokens_seen"] > 0  # 24 examples, 2 held out

    # resume: a second epoch continues from the saved checkpoint instead of starting over
    result = run(*common, "--epochs", 2)
    assert "resumed from" in result.output
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["optimizer_steps"] == 44

    model, tokenizer = hfs.load_model(str(chat_checkpoint))
    hfs.enable(model)
    strategy = hfs.Eagle.from_pretrained(out, target=model, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    assert_drafts_exactly(model, tokenizer, strategy)

    for fmt in ("vllm", "safeailab"):
        if fmt == "vllm" and version == "--eagle1":
            continue
        exported = tmp_path / f"export-{fmt}"
        run("export-eagle", out, "--out", exported, "--format", fmt)
        again = hfs.Eagle.from_pretrained(exported, target=model)
        for (name, a), b in zip(strategy.drafter.state_dict().items(), again.drafter.state_dict().values()):
            assert torch.equal(a, b), name


def test_train_eagle_max_minutes_stops_saves_a_checkpoint_and_goes_on(tmp_path, chat_checkpoint, prompts):
    """``--max-minutes``: a run out of time validates, saves the drafter and a checkpoint where it stopped (time trained
    included); the same command with more time goes on from there to the planned steps."""
    out = tmp_path / "drafter"
    common = ["train-eagle", "--target", chat_checkpoint, "--prompts", prompts, "--distill-tokens", 8, "--out", out,
              "--draft-vocab-size", 24, "--grad-accum", 1, "--eval-every", 100, "--val-prompts", 1, "--threads", 1,
              "--epochs", 1]
    run(*common, "--max-minutes", 1e-6)  # out of time after the first optimizer step
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["stopped_by_max_minutes"] and summary["optimizer_steps"] == 1 and summary["total_steps"] == 22
    progress = json.loads((out / "checkpoint" / "progress.json").read_text())
    assert progress["step"] == 1 and progress["train_seconds"] > 0
    assert (out / "model.safetensors").exists()

    result = run(*common, "--max-minutes", 60)
    assert "resumed from" in result.output and "at optimizer step 1" in result.output
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["optimizer_steps"] == 22 and not summary["stopped_by_max_minutes"]
    assert json.loads((out / "checkpoint" / "progress.json").read_text())["step"] == 1  # the end writes none
    bad = CliRunner().invoke(app, [str(a) for a in [*common, "--max-minutes", 0]], env=ENV)
    assert bad.exit_code != 0 and "max_minutes=0" in bad.output


def test_train_eagle_needs_data(tmp_path, chat_checkpoint):
    result = CliRunner().invoke(app, ["train-eagle", "--target", str(chat_checkpoint), "--out", str(tmp_path / "o")], env=ENV)
    assert result.exit_code != 0
    assert "--data" in result.output


def test_train_exit_adapter_end_to_end(tmp_path, chat_checkpoint, prompts):
    """``train-eagle --exit-layer K`` trains an adapter with the same loop, which EarlyExit loads and
    drafts with exactly; it has no serving-engine export, and says so."""
    out = tmp_path / "adapter"
    result = run("train-eagle", "--target", chat_checkpoint, "--prompts", prompts, "--distill-tokens", 16, "--out", out,
                 "--exit-layer", 1, "--draft-vocab-size", 24, "--grad-accum", 1, "--eval-every", 10, "--val-prompts", 2,
                 "--threads", 1, "--epochs", 1)
    assert "hfs.EarlyExit(adapter=" in result.output
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log and all(1.0 <= r["val_tau"] <= 7.0 for r in log) and len(log[-1]["val_acc"]) == 1
    config = json.loads((out / "config.json").read_text())
    assert config["exit_layer"] == 1 and config["target_layers"] == [0]

    model, tokenizer = hfs.load_model(str(chat_checkpoint))
    hfs.enable(model)
    assert_drafts_exactly(model, tokenizer, hfs.EarlyExit(adapter=out, num_tokens=4, confidence_threshold=0.0, adaptive=False))

    refused = CliRunner().invoke(app, ["export-eagle", str(out), "--out", str(tmp_path / "x"), "--format", "vllm"], env=ENV)
    assert refused.exit_code == 2 and "no vLLM or SafeAILab form" in refused.output


def test_train_exit_adapter_bad_options(tmp_path, chat_checkpoint, prompts):
    for extra, message in ((["--eagle1"], "drop --eagle1"), (["--unroll", 3], "use --unroll 1")):
        result = CliRunner().invoke(app, [str(a) for a in ["train-eagle", "--target", chat_checkpoint, "--data", prompts,
                                                           "--out", tmp_path / "o", "--exit-layer", 1, *extra]], env=ENV)
        assert result.exit_code != 0 and message in (result.output + str(result.exception)), result.output


def _first_drafter(tmp_path, chat_checkpoint, prompts, vocab_size):
    """A first drafter trained from the tiny chat model (``OUT`` is ``tmp_path/first``): the folder, the
    CLI options the continued runs share, the target, its tokenizer and the drafter in float32."""
    from hf_speculative.drafters.eagle import checkpoints

    first = tmp_path / "first"
    common = ["--target", chat_checkpoint, "--grad-accum", 1, "--eval-every", 100, "--val-prompts", 1, "--threads", 1]
    run("train-eagle", *common, "--prompts", prompts, "--distill-tokens", 16, "--out", first, "--draft-vocab-size",
        vocab_size, "--epochs", 1)
    model, tokenizer = hfs.load_model(str(chat_checkpoint))
    return first, common, model, tokenizer, checkpoints.load_drafter(first, dtype=torch.float32)


def _assert_exact(model, tokenizer, drafter_dir):
    """Greedy generation with the drafter in ``drafter_dir`` gives plain greedy's tokens."""
    hfs.enable(model)
    strategy = hfs.Eagle.from_pretrained(drafter_dir, target=model, num_tokens=4, confidence_threshold=0.0, adaptive=False)
    ids = tokenizer("the cat sat on", return_tensors="pt")
    ids = {k: ids[k] for k in ("input_ids", "attention_mask")}  # transformers 4.x adds token_type_ids
    ref = type(model).generate(model, **ids, max_new_tokens=20, do_sample=False)
    assert model.generate(**ids, max_new_tokens=20, do_sample=False, candidate_generator=strategy).tolist() == ref.tolist()


def test_train_eagle_init_from_continues_a_drafter(tmp_path, chat_checkpoint, prompts):
    """``--init-from`` starts from an existing drafter's weights and keeps its draft vocabulary (a new
    run would choose its own, here of another size); the continued drafter is still exact."""
    from hf_speculative.drafters.eagle import checkpoints
    from hf_speculative.training.config import TrainConfig
    from hf_speculative.training.data import read_examples
    from hf_speculative.training.start import initial_network

    first, common, model, tokenizer, trained = _first_drafter(tmp_path, chat_checkpoint, prompts, 24)

    cfg = TrainConfig(target=str(chat_checkpoint), data=[str(first / "self_distill.jsonl")], out=str(tmp_path / "x"),
                      draft_vocab_size=20, init_from=str(first))
    start, warm = initial_network(cfg, model, [])
    assert warm and start.training and start.config.draft_vocab_size == 24
    for (name, a), b in zip(trained.state_dict().items(), start.state_dict().values()):
        assert torch.equal(a, b), name
    fresh, _ = initial_network(dataclasses.replace(cfg, init_from=None), model,
                               read_examples(first / "self_distill.jsonl", tokenizer))
    assert fresh.config.draft_vocab_size == 20

    second = tmp_path / "second"
    run("train-eagle", *common, "--data", first / "self_distill.jsonl", "--out", second, "--init-from", first,
        "--epochs", 1)
    meta = json.loads((second / "training.json").read_text())
    assert meta["warm_start"] and meta["train_config"]["init_from"] == str(first)
    # the log starts with the continued drafter as it came in, validated on this run's held-out data
    log = [json.loads(line) for line in (second / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 22] and log[0]["tokens"] == 0 and log[1]["tokens"] > 0
    continued = checkpoints.load_drafter(second, dtype=torch.float32)
    assert torch.equal(continued.d2t, trained.d2t)
    assert not torch.equal(continued.fc.weight, trained.fc.weight)  # it did train

    _assert_exact(model, tokenizer, second)


def test_train_eagle_refresh_vocab(tmp_path, chat_checkpoint, prompts):
    """``--init-from D --refresh-vocab``: the draft vocabulary is chosen again from the run's data at
    ``--draft-vocab-size`` (bigger here); rows of tokens the drafter had keep their trained weights,
    new tokens start from the target's lm_head rows; the result trains, saves, reloads and is exact."""
    from hf_speculative import compat
    from hf_speculative.drafters.eagle import checkpoints
    from hf_speculative.training.config import TrainConfig
    from hf_speculative.training.data import draft_vocabulary, read_examples
    from hf_speculative.training.start import initial_network

    first, common, model, tokenizer, trained = _first_drafter(tmp_path, chat_checkpoint, prompts, 16)
    examples = read_examples(first / "self_distill.jsonl", tokenizer)
    cfg = TrainConfig(target=str(chat_checkpoint), data=[str(first / "self_distill.jsonl")], out=str(tmp_path / "x"),
                      draft_vocab_size=40, init_from=str(first), refresh_vocab=True)
    net, _ = initial_network(cfg, model, examples)
    wanted = draft_vocabulary(examples, 40, trained.config.vocab_size, compat.eos_token_ids(model.generation_config))
    assert net.config.draft_vocab_size == 40 and torch.equal(net.target_ids(), wanted)
    assert net.t2d.sum() == 40 and net.t2d[wanted].all()
    old = {int(t): i for i, t in enumerate(trained.target_ids().tolist())}
    head = model.get_output_embeddings().weight
    assert 0 < sum(int(t) in old for t in wanted) < 40
    for j, t in enumerate(wanted.tolist()):
        expect = trained.lm_head.weight[old[t]] if t in old else head[t]
        assert torch.equal(net.lm_head.weight[j], expect), t
    for name in ("fc.weight", "norm.weight"):
        assert torch.equal(net.state_dict()[name], trained.state_dict()[name])

    second = tmp_path / "second"
    run("train-eagle", *common, "--data", first / "self_distill.jsonl", "--out", second, "--init-from", first,
        "--refresh-vocab", "--draft-vocab-size", 40, "--epochs", 1)
    continued = checkpoints.load_drafter(second, dtype=torch.float32)
    assert torch.equal(continued.target_ids(), wanted)
    _assert_exact(model, tokenizer, second)

    with pytest.raises(ValueError, match="needs init_from"):
        TrainConfig(target="t", data=["d"], out="o", refresh_vocab=True)
    with pytest.raises(ValueError, match="EAGLE-1 uses the target's whole vocabulary"):
        TrainConfig(target="t", data=["d"], out="o", init_from="x", eagle3=False, refresh_vocab=True)


def test_train_eagle_init_from_errors(tmp_path, chat_checkpoint, prompts):
    """A missing --init-from, or a network of another kind (which it names), is refused before any
    self-distillation."""
    missing = CliRunner().invoke(app, [str(a) for a in ["train-eagle", "--target", chat_checkpoint, "--prompts", prompts,
                                                        "--out", tmp_path / "o", "--init-from", tmp_path / "nope"]], env=ENV)
    assert missing.exit_code != 0 and "no such folder" in missing.output, missing.output
    assert not (tmp_path / "o" / "self_distill.jsonl").exists()

    eagle3 = tmp_path / "e3"
    run("train-eagle", "--target", chat_checkpoint, "--prompts", prompts, "--distill-tokens", 8, "--out", eagle3,
        "--draft-vocab-size", 24, "--grad-accum", 1, "--eval-every", 100, "--val-prompts", 1, "--threads", 1,
        "--max-examples", 4, "--epochs", 1)
    for kind, message in ((["--eagle1"], "is an EAGLE-3 drafter, but this run trains an EAGLE-1 drafter"),
                          (["--exit-layer", 1], "is an EAGLE-3 drafter, but this run trains an exit adapter for layer 1")):
        result = CliRunner().invoke(app, [str(a) for a in ["train-eagle", "--target", chat_checkpoint, "--prompts", prompts,
                                                           "--out", tmp_path / "o2", *kind, "--init-from", eagle3,
                                                           "--threads", 1]], env=ENV)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
        assert not (tmp_path / "o2" / "self_distill.jsonl").exists()  # refused before self-distillation


@pytest.mark.parametrize("spec, command", [
    ("builtin:1600", "python -m tools.prompts builtin 1600 --out prompts.jsonl"),
    ("builtin:900-3000", "python -m tools.prompts builtin 900-3000 --out prompts.jsonl"),
    ("wordnet:3200-6000", "python -m tools.prompts wordnet 3200-6000 --out prompts.jsonl"),
    ("context:0-1600", "python -m tools.prompts context 0-1600 --passages a.jsonl --out prompts.jsonl"),
])
def test_moved_prompt_lists_name_the_tools_command(tmp_path, spec, command):
    """``--prompts builtin:N / context:N / wordnet:N`` (lists that left the package) fail before any model loads,
    in both commands, with the ``tools/`` command that writes the same prompts to a file."""
    passages = ["--passages", "a.jsonl"] if spec.startswith("context") else []
    for args in (["self-distill", "--target", "nowhere", "--prompts", spec, *passages],
                 ["train-eagle", "--target", "nowhere", "--out", str(tmp_path / "o"), "--prompts", spec, *passages]):
        result = CliRunner().invoke(app, args, env=ENV)
        output = " ".join(result.output.replace("│", " ").split())
        assert result.exit_code == 2, result.output
        assert f"--prompts {spec}: the team's {spec.split(':')[0]} prompt list is not part of the package" in output
        assert f"`{command}`" in output, output
    assert not (tmp_path / "o").exists()


def test_prompts_file_named_like_a_list_is_read(tmp_path, monkeypatch):
    """A file whose name only looks like a moved list (``builtin:3``) is a prompts file."""
    from hf_speculative.training.cli import _prompt_rows

    monkeypatch.chdir(tmp_path)
    (tmp_path / "builtin:3").write_text(json.dumps({"prompt": "hello"}) + "\n")
    assert _prompt_rows("builtin:3") == [{"prompt": "hello", "id": "line000000"}]


def test_passages_without_the_context_list_name_the_tools_command(tmp_path, prompts):
    for args in (["self-distill", "--target", "nowhere", "--prompts", str(prompts)],
                 ["train-eagle", "--target", "nowhere", "--out", str(tmp_path / "o"), "--data", str(prompts)]):
        result = CliRunner().invoke(app, [*args, "--passages", "answers.jsonl"], env=ENV)
        output = " ".join(result.output.replace("│", " ").split())
        assert result.exit_code == 2 and "--passages fed the team's context prompt list" in output, result.output
        assert "python -m tools.prompts context N --passages FILE --out prompts.jsonl" in output
    assert "--passages" not in CliRunner().invoke(app, ["self-distill", "--help"], env=ENV).output  # hidden


def test_self_distill_needs_prompts():
    result = CliRunner().invoke(app, ["self-distill", "--target", "nowhere"], env=ENV)
    assert result.exit_code == 2 and "--prompts" in result.output  # no built-in default list any more
