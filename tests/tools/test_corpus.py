"""``python -m tools.corpus``: the self-distillation corpus in one command, on a tiny random chat model, a tiny
WordNet and fortune files of the test's own (no Hub, no Debian packages): the mix deduplicated, Spec-Bench's
questions dropped and counted, the held-out split stable across re-runs and growth, answers resumed and grown
without being redone, the manifest's counts, and an ``--out`` inside the repository refused.

All three sources run here, the target's own messages (Magpie) included: the tiny model samples them through the
test chat template (``tests/conftest.py``'s ``make_chat_tokenizer``)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from hf_speculative.bench.spec_bench import DATASET
from tests.conftest import make_chat_tokenizer
from tests.tools.test_wordnet_prompts import SENSES, _fortunes, _wordnet
from tools.corpus.__main__ import main
from tools.corpus.build import REPO, build, status
from tools.corpus.files import answers_path, magpie_path, prompts_path, read_rows
from tools.corpus.mix import held_out_score, mix_text, normalise, parse_mix, seat_sources
from tools.corpus.sources import Exhausted
from tools.prompts import builtin

pytestmark = pytest.mark.single_version
# few, short answers; a quarter held out so that a corpus of 8-20 prompts has both splits; the tiny model ends about
# one message in four within 40 tokens (tests/training/test_magpie.py)
KW = {"max_new_tokens": 4, "batch_size": 4, "held_out": 0.25, "cpu_layout": "none", "progress_output": False,
      "magpie": {"batch_size": 16, "max_new_tokens": 40, "min_words": 2}}
FIRST_TURNS = [json.loads(line)["turns"][0] for line in DATASET.read_text().splitlines() if line.strip()]


@pytest.fixture
def env(tmp_path, monkeypatch, chat_model):
    """The target (the tiny chat model with its role markers as special tokens, saved as a folder), and the
    WordNet and fortune folders of tests/tools/test_wordnet_prompts.py; the built-in list without this machine's
    German manual pages (slow to read, and they vary between machines)."""
    monkeypatch.setattr(builtin, "_german_paragraphs", lambda limit=600: [])
    tokenizer = make_chat_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    chat_model.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    return {"target": str(tmp_path / "target"), "wordnet_dir": _wordnet(tmp_path / "wordnet"),
            "fortune_dir": _fortunes(tmp_path / "fortunes")}


def corpus(out: Path) -> dict[str, list[dict]]:
    """The corpus's four files' rows."""
    return {f"{kind}/{split}": read_rows(path(out, split)) for kind, path in (("prompts", prompts_path),
            ("answers", answers_path)) for split in ("train", "held_out")}


def file_bytes(out: Path) -> dict[str, bytes]:
    return {f"{kind}/{split}": path(out, split).read_bytes() for kind, path in (("prompts", prompts_path),
            ("answers", answers_path)) for split in ("train", "held_out")}


def inject(monkeypatch, wordnet_first: str) -> list[str]:
    """Put five bad candidates at the head of the built-in list: a Spec-Bench question, a prompt containing one
    (other case and spacing), one sharing 8 words with one, a WordNet prompt again (other case and spacing), and one
    longer than 1024 tokens. Returns their texts."""
    question = next(q for q in FIRST_TURNS if len(re.findall(r"\w+", q)) > 14)
    eight = " ".join(re.findall(r"\w+", question.lower())[3:11])
    bad = [FIRST_TURNS[0], "Please help me:\n  " + question.upper(), f"Tell a story in which {eight} happens.",
           "  " + wordnet_first.upper().replace(" ", "   "), "cat " * 1100]
    real = builtin.build_prompts
    monkeypatch.setattr(builtin, "build_prompts", lambda n, seed=0: [
        {"id": f"x{i}", "category": "injected", "prompt": text} for i, text in enumerate(bad)] + real(n, seed=seed))
    return bad


def test_mix_order_is_proportional_interleaved_and_prefix_stable():
    mix = parse_mix("wordnet=0.5,magpie=0.3,builtin=0.2")
    assert mix == {"wordnet": Fraction(1, 2), "magpie": Fraction(3, 10), "builtin": Fraction(1, 5)}  # exact
    assert parse_mix("builtin=2,magpie=0,wordnet=5") == {"wordnet": Fraction(5, 7), "builtin": Fraction(2, 7)}
    assert parse_mix(mix_text(parse_mix("wordnet=5,builtin=2"))) == parse_mix("wordnet=5,builtin=2")
    places = seat_sources(mix, 1000)
    assert places[:10] == ["wordnet", "magpie", "builtin", "wordnet", "wordnet", "magpie", "wordnet", "builtin",
                           "magpie", "wordnet"]
    assert all(abs(places[:n].count(s) - share * n) <= 1 for n in (7, 100, 1000) for s, share in mix.items())
    assert seat_sources(mix, 37) == places[:37]
    for bad, message in (("wordnet=0.5,nope=1", "with each of wordnet, magpie, builtin at most once"),
                         ("wordnet=1,wordnet=1", "at most once"), ("wordnet", "at most once"),
                         ("wordnet=x", "'x' is not a number >= 0"), ("wordnet=-1", "is not a number >= 0"),
                         ("wordnet=0", "at least one source a share > 0")):
        with pytest.raises(ValueError, match=message):
            parse_mix(bad)


def test_held_out_score_depends_on_the_normalised_text_alone():
    assert held_out_score("What is  a Kettle?\n") == held_out_score("what is a kettle?")
    assert held_out_score("what is a kettle?") != held_out_score("what is a hammer?")
    scores = [held_out_score(f"prompt number {i}") for i in range(4000)]
    assert 0.015 < sum(s < 0.02 for s in scores) / len(scores) < 0.025


def test_build_dedups_drops_spec_bench_and_counts_it(env, tmp_path, monkeypatch, capsys):
    from tools.prompts.wordnet import build_wordnet_prompts

    wordnet_first = build_wordnet_prompts(1, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"])[0]
    bad = inject(monkeypatch, wordnet_first["prompt"])
    out = tmp_path / "corpus"
    args = ["build", "--target", env["target"], "--out", str(out), "--answers", "12", "--held-out", "0.25",
            "--max-new-tokens", "4", "--batch-size", "4", "--cpu-layout", "none", "--magpie-batch-size", "16",
            "--magpie-max-new-tokens", "40", "--magpie-min-words", "2", "--wordnet-dir", str(env["wordnet_dir"]),
            "--fortune-dir", str(env["fortune_dir"])]
    assert main(args) == 0
    files = corpus(out)
    prompts = sorted(files["prompts/train"] + files["prompts/held_out"], key=lambda r: r["seat"])
    assert [r["seat"] for r in prompts] == list(range(12))
    assert [r["source"] for r in prompts] == seat_sources(parse_mix("wordnet=0.5,magpie=0.3,builtin=0.2"), 12)
    assert prompts[0]["id"] == wordnet_first["id"] and all(r["category"] == "self-written"
                                                           for r in prompts if r["source"] == "magpie")
    norms = [normalise(r["prompt"]) for r in prompts]
    assert len(set(norms)) == 12 and not {r["id"] for r in prompts} & {f"x{i}" for i in range(len(bad))}
    assert not any(normalise(q) in n for q in FIRST_TURNS for n in norms)

    manifest = json.loads((out / "MANIFEST.json").read_text())
    sources = manifest["sources"]
    assert sources["builtin"]["dropped"] == {"spec_bench_question": 2, "spec_bench_8_words": 1, "duplicate": 1,
                                             "too_long": 1}
    assert sources["wordnet"]["dropped"] == dict.fromkeys(sources["wordnet"]["dropped"], 0)
    for name, stat in sources.items():
        assert stat["asked"] == stat["kept"] == sum(r["source"] == name for r in prompts)
        assert stat["candidates"] == stat["kept"] + sum(stat["dropped"].values())
    assert sources["magpie"]["candidates"] <= len(read_rows(magpie_path(out)))
    assert sum(s["asked"] for s in sources.values()) == manifest["answers_asked"] == 12
    assert manifest["prompts"] == {"train": len(files["prompts/train"]), "held_out": len(files["prompts/held_out"]),
                                   "total": 12}
    answers = files["answers/train"] + files["answers/held_out"]
    assert sorted(r["id"] for r in answers) == sorted(r["id"] for r in prompts)
    assert manifest["answers"]["done"] == 12 and manifest["answers"]["by_split"] == {
        "train": len(files["answers/train"]), "held_out": len(files["answers/held_out"])}
    assert manifest["answers"]["by_source"] == {s: st["asked"] for s, st in sorted(sources.items())}
    assert manifest["answers"]["tokens"]["total"] == sum(len(r["prompt_tokens"]) + len(r["response_tokens"])
                                                         for r in answers)
    assert manifest["command"] == "python -m tools.corpus " + " ".join(args)
    assert manifest["target"]["weights_sha256"].keys() == {"model.safetensors"}
    assert manifest["settings"]["mix"] == "wordnet=1/2,magpie=3/10,builtin=1/5"
    readme = (out / "README.md").read_text()
    assert "**wordnet**, 50% of the prompts" in readme and "1 duplicate" in readme and manifest["recreate"] in readme
    printed = capsys.readouterr().out
    assert "12/12 answers (100.0%)" in printed and re.search(r"builtin +2/2 answers", printed)


def test_held_out_split_resume_and_growth(env, tmp_path):
    out = tmp_path / "corpus"
    build(env["target"], out, answers=8, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **KW)
    small, small_bytes = corpus(out), file_bytes(out)
    assert small["prompts/held_out"] and small["prompts/train"]
    for split, rows in (("held_out", small["prompts/held_out"]), ("train", small["prompts/train"])):
        assert all((held_out_score(r["prompt"]) < 0.25) == (split == "held_out") for r in rows)

    build(env["target"], out, answers=8, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **KW)
    assert file_bytes(out) == small_bytes  # the same command again: nothing to do

    path = answers_path(out, "train")  # killed while writing its fourth answer
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:25])
    assert f"training 3/{len(small['prompts/train'])}" in status(out)  # a run may be writing: its last row not yet
    build(env["target"], out, answers=8, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **KW)
    resumed = corpus(out)
    assert resumed["answers/train"][:3] == small["answers/train"][:3]
    assert sorted(map(json.dumps, resumed["answers/train"])) == sorted(map(json.dumps, small["answers/train"]))

    build(env["target"], out, answers=20, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **KW)
    grown = corpus(out)
    for name, rows in resumed.items():  # every prompt and answer kept as it was, the new ones after them
        assert grown[name][: len(rows)] == rows
    answers = grown["answers/train"] + grown["answers/held_out"]
    assert len(answers) == 20 and len({r["id"] for r in answers}) == 20
    assert all(held_out_score(r["prompt"]) < 0.25 for r in grown["prompts/held_out"])
    assert all(held_out_score(r["prompt"]) >= 0.25 for r in grown["prompts/train"])
    for split in ("held_out", "train"):
        assert {r["id"] for r in grown[f"answers/{split}"]} == {r["id"] for r in grown[f"prompts/{split}"]}
    assert "20/20 answers" in status(out)

    once = tmp_path / "once"  # a corpus of 20 built at once holds the same prompts, split alike
    build(env["target"], once, answers=20, prompts_only=True, wordnet_dir=env["wordnet_dir"],
          fortune_dir=env["fortune_dir"], **KW)
    for split in ("train", "held_out"):
        assert prompts_path(once, split).read_bytes() == prompts_path(out, split).read_bytes()
    assert not answers_path(once, "train").exists()
    assert re.search(r"0/20 answers \(0.0%\); 20/20 prompts built", status(once))


def test_bad_out_dirs_and_settings_are_refused(env, tmp_path, capsys):
    inside = REPO / "corpus-test-refused"
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--target", env["target"], "--out", str(inside)])
    assert exit_.value.code == 2 and not inside.exists()
    assert re.search(r"--out .*corpus-test-refused is inside the repository .*give a folder outside it, e\.g\. --out "
                     r".*corpora/corpus-test-refused", capsys.readouterr().err)

    out = tmp_path / "corpus"
    kw = {**KW, "magpie": None}
    build(env["target"], out, answers=4, mix="wordnet=1,builtin=1", prompts_only=True,
          wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **kw)
    for change, message in (({"seed": 1}, r"built with other settings \(seed: 0 there, 1 now\).* build into a new"),
                            ({"mix": "wordnet=1"}, r"other settings \(mix: .*python -m tools.corpus build --target"),
                            ({"dtype": "bfloat16"}, (r"other settings \(dtype: 'float32' there, 'bfloat16' now\).*"
                                                     r"--held-out 0.25 .*--dtype float32")),
                            ({"answers": 3}, (r"holds 4 prompts already, more than the 3 asked for: a corpus "
                                              r"only grows; ask for --answers 4 or more"))):
        args = {"answers": 4, "mix": "wordnet=1,builtin=1", **change}
        with pytest.raises(ValueError, match=message):
            build(env["target"], out, prompts_only=True, wordnet_dir=env["wordnet_dir"],
                  fortune_dir=env["fortune_dir"], **{**kw, **args})
    manifest = json.loads((out / "MANIFEST.json").read_text())  # the refused runs changed nothing
    assert len(manifest["runs"]) == 1 and manifest["answers_asked"] == 4 and manifest["settings"]["seed"] == 0
    assert manifest["recreate"].endswith("--dtype float32")  # the target's dtype is part of the corpus
    del manifest["settings"]["dtype"]  # a corpus from before the setting: resumed in the default dtype
    (out / "MANIFEST.json").write_text(json.dumps(manifest))
    build(env["target"], out, answers=4, mix="wordnet=1,builtin=1", prompts_only=True, wordnet_dir=env["wordnet_dir"],
          fortune_dir=env["fortune_dir"], **kw)
    assert json.loads((out / "MANIFEST.json").read_text())["settings"]["dtype"] == "float32"
    manifest = json.loads((out / "MANIFEST.json").read_text())
    del manifest["settings"]["dtype"]  # ... unless its runs were given one: then in that one only
    manifest["runs"][-1]["dtype"] = "bfloat16"
    (out / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"other settings \(dtype: 'bfloat16' there, 'float32' now\)"):
        build(env["target"], out, answers=4, mix="wordnet=1,builtin=1", prompts_only=True,
              wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **kw)
    with open(out / ".lock", "a+") as held:  # another build at work on the folder
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match="another `python -m tools.corpus build` is writing .*let it finish"):
            build(env["target"], out, answers=6, mix="wordnet=1,builtin=1", **kw)
    with pytest.raises(Exhausted, match=r"the wordnet list ran out of prompts \(only [0-9]+ distinct prompts can be "
                                        r"built .*\): lower its share in --mix, or --answers"):
        (tmp_path / "no-fortunes").mkdir()  # one abstract noun and no fortunes: a handful of prompts
        build(env["target"], tmp_path / "large", answers=50, mix="wordnet=1", prompts_only=True,
              wordnet_dir=_wordnet(tmp_path / "tiny", SENSES[9:10]), fortune_dir=tmp_path / "no-fortunes", **kw)
    with pytest.raises(FileNotFoundError, match="no corpus in .*build one with python -m tools.corpus build"):
        status(tmp_path / "nothing")
    for bad in ({"held_out": 1.0}, {"answers": 0}):
        with pytest.raises(ValueError, match="each must be >= 1; --held-out .* must be in \\[0, 1\\)"):
            build(env["target"], tmp_path / "other", **{**kw, **bad})


def test_lists_written_here_build_the_same_corpus_elsewhere(env, tmp_path):
    """``lists`` writes the WordNet and built-in candidates to files; ``build --lists`` reads them (a machine without
    the Debian files: none given here) and writes the prompt list a build from the files writes; a list changed
    afterwards, or written for another seed or mix, is refused; a list too short says what to write."""
    from tools.corpus.lists import ListFile, list_path, write_lists

    lists = tmp_path / "lists"
    assert main(["lists", "--out", str(lists), "--answers", "12", "--wordnet-dir", str(env["wordnet_dir"]),
                 "--fortune-dir", str(env["fortune_dir"])]) == 0
    meta = json.loads((lists / "lists.json").read_text())
    assert meta["seed"] == 0 and meta["lists"].keys() == {"wordnet", "builtin"}
    # 1.5 times the source's places and 100 more: wordnet 1.5 x 6 + 100, builtin ceil(1.5 x 2.4) + 100
    assert {name: entry["rows"] for name, entry in meta["lists"].items()} == {"wordnet": 109, "builtin": 104}
    here, there = tmp_path / "here", tmp_path / "there"
    build(env["target"], here, answers=12, prompts_only=True, wordnet_dir=env["wordnet_dir"],
          fortune_dir=env["fortune_dir"], **KW)
    manifest = build(env["target"], there, answers=12, prompts_only=True, lists=lists, **KW)
    for split in ("train", "held_out"):
        assert prompts_path(there, split).read_bytes() == prompts_path(here, split).read_bytes()
    assert manifest["runs"][-1]["lists"]["lists"] == meta["lists"]
    with pytest.raises(ValueError, match="written for --seed 0, this build has --seed 1"):
        build(env["target"], tmp_path / "seed1", answers=12, seed=1, prompts_only=True, lists=lists, **KW)
    short = tmp_path / "short"  # only the WordNet list: a mix with built-in prompts needs the other
    write_lists(short, answers=4, mix="wordnet=1", seed=0, wordnet_dir=env["wordnet_dir"],
                fortune_dir=env["fortune_dir"])
    with pytest.raises(ValueError, match="no builtin list there .*write the lists again with this build's --mix"):
        build(env["target"], tmp_path / "mix", answers=12, prompts_only=True, lists=short, **KW)
    list_path(lists, "wordnet").write_text(list_path(lists, "wordnet").read_text() + "\n")
    with pytest.raises(ValueError, match="wordnet.jsonl: changed since lists.json was written"):
        build(env["target"], tmp_path / "changed", answers=12, prompts_only=True, lists=lists, **KW)
    three = ListFile(list_path(short, "wordnet"))
    rows = three.rows
    assert three(2) == rows[:2] and three(len(rows) + 5) == rows  # all it has, once
    with pytest.raises(ValueError, match=f"only {len(rows)} prompts in .*write the lists for more answers"):
        three(len(rows) + 6)


def test_max_minutes_stops_the_answers_and_the_same_command_goes_on(env, tmp_path):
    out = tmp_path / "corpus"
    kw = {**KW, "magpie": None, "mix": "wordnet=1,builtin=1"}
    first = build(env["target"], out, answers=8, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"],
                  max_minutes=1e-9, **kw)
    assert first["answers"]["done"] == 0 and first["runs"][-1]["stopped_by_max_minutes"]
    assert "0/8 answers" in status(out) and first["prompts"]["total"] == 8
    again = build(env["target"], out, answers=8, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"],
                  sort_window=0, **kw)
    assert again["answers"]["done"] == 8 and "stopped_by_max_minutes" not in again["runs"][-1]
    with pytest.raises(ValueError, match="--max-minutes 0, --sort-window 0: the minutes must be > 0"):
        build(env["target"], out, answers=8, max_minutes=0, sort_window=0, **kw)


def test_a_corpus_begun_in_one_dtype_answers_on_in_another_and_says_so(env, tmp_path):
    """A corpus begun in bfloat16 resumed on a CPU that emulates it: ``answers_dtype`` writes its remaining answers
    in float32 once the prompt list is complete (never the target's own messages), keeps the corpus's setting, and
    records the switch in the run with the answers there at its start."""
    out = tmp_path / "corpus"
    kw = {**KW, "magpie": None, "mix": "wordnet=1,builtin=1", "wordnet_dir": env["wordnet_dir"],
          "fortune_dir": env["fortune_dir"]}
    first = build(env["target"], out, answers=8, dtype="bfloat16", max_minutes=1e-9, **kw)
    assert first["answers"]["done"] == 0 and first["prompts"]["total"] == 8
    with pytest.raises(ValueError, match="--answers-dtype float32: the prompt list of .* is not complete"):
        build(env["target"], out, answers=12, dtype="bfloat16", answers_dtype="float32", **kw)  # grown: prompts first
    again = build(env["target"], out, answers=8, dtype="bfloat16", answers_dtype="float32", **kw)
    assert again["answers"]["done"] == 8 and again["settings"]["dtype"] == "bfloat16"
    assert again["runs"][-1]["dtype"] == "float32" and again["runs"][-1]["answers_at_start"] == 0
    assert "answers_at_start" not in again["runs"][0]
    with pytest.raises(ValueError, match="dtype: 'bfloat16' there, 'float32' now"):  # the setting is still checked
        build(env["target"], out, answers=8, dtype="float32", **kw)


def test_the_target_on_another_device_takes_no_cpu_layout(env):
    from tools.corpus.answers import load_target

    with pytest.raises(ValueError, match="--cpu-layout all with --device cuda: a CPU layout is for the CPU"):
        load_target(env["target"], cpu_layout="all", device="cuda")  # refused before anything loads
    with pytest.raises(ValueError, match="--dtype fp8: use float32, bfloat16, float16 or auto"):
        load_target(env["target"], dtype="fp8")
    model, _ = load_target(env["target"], cpu_layout="none", dtype="bfloat16")
    assert next(model.parameters()).dtype.is_floating_point and str(next(model.parameters()).dtype) == "torch.bfloat16"


def test_processes_share_the_chunks_and_write_what_one_process_writes(env, tmp_path, capfd):
    """Two one-thread processes (one started by the build) each answer every other chunk of prompts into the same
    files: the same rows as one process, none twice, none torn; a killed run's unfinished row is cut first. (The
    held-out prompts are the first chunk, the training prompts the second: one for each process.)"""
    kw = {**KW, "magpie": None, "mix": "wordnet=1,builtin=1", "batch_size": 1}
    one, two = tmp_path / "one", tmp_path / "two"
    build(env["target"], one, answers=12, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **kw)
    build(env["target"], two, answers=6, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"], **kw)
    path = answers_path(two, "train")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:25])  # killed while writing its last answer
    manifest = build(env["target"], two, answers=12, wordnet_dir=env["wordnet_dir"], fortune_dir=env["fortune_dir"],
                     processes=2, **{**kw, "progress_output": True})
    assert manifest["answers"]["done"] == 12 and manifest["runs"][-1]["processes"] == 2
    printed = capfd.readouterr().out  # the started process's lines too
    assert "cut its last, unfinished row" in printed
    assert re.search(r"self-distill \(process 2 of 2\): (\d+)/\1 answers", printed)  # the training chunk
    for split in ("train", "held_out"):
        rows = read_rows(answers_path(two, split))
        assert len(rows) == len({r["id"] for r in rows})  # none twice
        key = lambda r: r["id"]
        assert sorted(rows, key=key) == sorted(read_rows(answers_path(one, split)), key=key)
    assert "12/12 answers" in status(two)
    with pytest.raises(ValueError, match="--processes 2 with --device cuda --threads None: .* several are for the CPU"):
        build(env["target"], two, answers=12, processes=2, device="cuda", **kw)
    with pytest.raises(ValueError, match="--processes 0 with --device cpu"):
        build(env["target"], two, answers=12, processes=0, **kw)


def test_processes_sample_the_targets_messages_as_one_process_does(env, tmp_path, capfd):
    """Two one-thread processes share the Magpie batches (the started one every other batch, through a part file):
    the same messages file and prompts as one one-thread process, also when resumed; the part files are gone after.
    A helper that fails is raised, naming it, and the messages written are kept."""
    from tools.corpus.magpie_processes import part_path, sample_in_processes
    from tools.corpus.sources import magpie_options

    kw = {**KW, "mix": "magpie=1", "prompts_only": True}
    one, two = tmp_path / "one", tmp_path / "two"
    build(env["target"], one, answers=10, threads=1, **kw)
    rows = read_rows(magpie_path(one))
    assert max(r["batch"] for r in rows) >= 2  # batches from both processes
    build(env["target"], two, answers=4, processes=2, **kw)
    build(env["target"], two, answers=10, processes=2, **kw)  # grown: resumed from the file's last batch
    assert magpie_path(two).read_bytes() == magpie_path(one).read_bytes()
    assert corpus(two) == corpus(one)
    assert not list(magpie_path(two).parent.glob("*.part*"))

    load = {"target": str(tmp_path / "no-such-target"), "cpu_layout": "none", "device": "cpu", "dtype": None}
    out = tmp_path / "three" / "magpie.jsonl"
    from tools.corpus.answers import load_target

    with pytest.raises(RuntimeError, match=r"magpie: helper process 1 stopped \(exit code 1\) before batch 1; .*"
                                           "Run the same command again"):
        sample_in_processes(out, 30, 2, load, lambda: load_target(env["target"], cpu_layout="none"), 0,
                            magpie_options(**{**KW["magpie"], "progress": False}))
    assert len(read_rows(out)) >= 1 and not part_path(out, 1).exists()  # batch 0's messages kept
    capfd.readouterr()


def test_a_magpie_helper_stops_when_its_parent_is_gone(env, tmp_path):
    """A helper whose parent was killed outright (it is then another process's child) samples nothing and returns,
    rather than polling for ever."""
    import multiprocessing

    from tools.corpus.magpie_processes import _helper, part_path
    from tools.corpus.sources import magpie_options

    load = {"target": env["target"], "cpu_layout": "none", "device": "cpu", "dtype": None}
    context = multiprocessing.get_context("spawn")
    path = tmp_path / "magpie.jsonl"
    options = magpie_options(**{**KW["magpie"], "progress": False})
    _helper(load, str(path), 1, 2, 0, 0, options, context.Value("q", 0), context.Event(), parent=-1)
    assert part_path(path, 1).read_bytes() == b""
    stop = context.Event()  # the control: its parent alive, it samples its first batch (1) until stopped

    def stop_after_a_batch():
        while not part_path(path, 1).read_bytes():
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=stop_after_a_batch, daemon=True).start()
    _helper(load, str(path), 1, 2, 0, 0, options, context.Value("q", 0), stop, parent=os.getppid())
    assert [r["batch"] for r in read_rows(part_path(path, 1))][:1] == [1]


def test_questions_are_the_held_out_prompts_in_spec_bench_form(env, tmp_path, capsys):
    from hf_speculative.bench.spec_bench import load_prompts

    out = tmp_path / "corpus"
    build(env["target"], out, answers=20, prompts_only=True, wordnet_dir=env["wordnet_dir"],
          fortune_dir=env["fortune_dir"], **KW)
    held_out = read_rows(prompts_path(out, "held_out"))
    to = tmp_path / "held_out.jsonl"
    assert main(["questions", "--out", str(out), "--to", str(to)]) == 0
    printed = capsys.readouterr().out
    prompts = load_prompts(to)
    assert sorted(p.text for p in prompts) == sorted(r["prompt"] for r in held_out)
    categories = list(dict.fromkeys(r["category"] for r in held_out))
    assert f"--categories {','.join(categories)}" in printed
    assert main(["questions", "--out", str(out), "--to", str(to), "--per-category", "1"]) == 0
    assert sorted(p.category for p in load_prompts(to)) == sorted(categories)  # the first of each
    assert [p.text for p in load_prompts(to)] == [next(r["prompt"] for r in held_out if r["category"] == c)
                                                  for c in categories]
    with pytest.raises(SystemExit):
        main(["questions", "--out", str(tmp_path / "none"), "--to", str(to)])
    assert "no prompt list" in capsys.readouterr().err


def test_a_registry_targets_weights_are_recorded_once_converted(tmp_path, monkeypatch):
    """A build that starts before the registry's target is converted (a new machine: the first load converts it)
    records the converted weights' sha256 at the next refresh of the manifest, and never recomputes it after."""
    from tools.corpus import build as corpus_build

    calls = []

    def identity(name):
        calls.append(name)
        return {"name": name, "registry": True, "weights_sha256": "ab" * 32}

    written = []
    monkeypatch.setattr(corpus_build, "target_identity", identity)
    monkeypatch.setattr(corpus_build, "write_manifest", lambda out, manifest: written.append(
        json.loads(json.dumps(manifest))))
    manifest = {"target": {"name": "smollm2-135m-instruct", "registry": True}, "answers_asked": 1}
    corpus_build._refresh(tmp_path, manifest)
    assert written[-1]["target"]["weights_sha256"] == "ab" * 32 and calls == ["smollm2-135m-instruct"]
    corpus_build._refresh(tmp_path, manifest)
    assert calls == ["smollm2-135m-instruct"] and written[-1]["target"]["weights_sha256"] == "ab" * 32
