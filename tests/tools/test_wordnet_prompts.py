"""The topic-diverse prompt list (``python -m tools.prompts wordnet N``): WordNet and fortune files parsed, prompts
built from every pool, deterministic, and clear errors where the Debian packages are missing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hf_speculative.bench.spec_bench import DATASET
from tools.prompts import wordnet as wp
from tools.prompts.__main__ import build_rows, main

HEADER = "  1 This software and database is being provided to you, the LICENSEE, by Princeton University\n"
# (offset, lexfile, lemma, instance, tagged, gloss)
SENSES = [
    ("00000001", 18, "Ada_Lovelace", True, 0, 'English mathematician (1815-1852); "she wrote the first program"'),
    ("00000002", 15, "Oslo", True, 0, "the capital and largest city of Norway"),
    ("00000003", 11, "Battle_of_Hastings", True, 0, "the battle in 1066 that began the Norman conquest"),
    ("00000004", 6, "kettle", False, 3, 'a metal pot for boiling water; "the kettle sang"'),
    ("00000005", 6, "hammer", False, 5, "a hand tool with a heavy head for driving nails"),
    ("00000006", 13, "lentil", False, 1, "round flat seed of the lentil plant used for food"),
    ("00000007", 13, "bread", False, 9, "food made from dough of flour and water, baked"),
    ("00000008", 5, "otter", False, 2, "freshwater carnivorous mammal with webbed feet"),
    ("00000013", 5, "heron", False, 1, "grey or white wading bird with long neck and legs"),
    ("00000014", 9, "curiosity", False, 4, "a state in which you want to learn more about something"),
    ("00000015", 9, "memory", False, 7, "the cognitive processes whereby past experience is remembered"),
    ("00000016", 18, "carpenter", False, 2, "a woodworker who makes or repairs wooden objects"),
    ("00000017", 6, "flux_gate_widget", False, 0, "an obscure device nobody writes about"),
]
LONG = ("A farmer once found a talking fish in his net. The fish promised him three wishes if he let it go, and "
        "the farmer, who had never wished for anything in his life, spent the whole winter deciding. By spring "
        "he had asked for a new roof, a warm coat for his wife and, last, that the fish should have a good life.")
SHORT = "Never put off till tomorrow what you can do the day after tomorrow."
GERMAN = ["Wer zuletzt lacht, hat den Witz nicht verstanden, sagt man in unserem Dorf.",
          "Morgenstund hat Gold im Mund, aber der Abend hat das bessere Programm."]


def _wordnet(directory: Path, senses=SENSES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data, index = [HEADER], [HEADER]
    for offset, lexfile, lemma, instance, tagged, gloss in senses:
        pointer = "@i" if instance else "@"
        data.append(f"{offset} {lexfile:02d} n 01 {lemma} 0 001 {pointer} 00000099 n 0000 | {gloss}  \n")
        index.append(f"{lemma.lower()} n 1 1 {pointer} 1 {tagged} {offset}  \n")
    (directory / "data.noun").write_text("".join(data))
    (directory / "index.noun").write_text("".join(index))
    return directory


def _fortunes(directory: Path) -> Path:
    (directory / "de").mkdir(parents=True, exist_ok=True)
    (directory / "people").write_text("\n%\n".join([LONG, SHORT, "Too short.", "-=" * 30]) + "\n")
    (directory / "people.dat").write_bytes(b"\x00\x01 binary index")
    (directory / "art").write_text("  /\\_/\\   a cat drawn in characters, long enough to pass the length test\n")
    (directory / "de" / "sprichworte").write_text("\n%\n".join(GERMAN) + "\n")
    return directory


@pytest.fixture
def sources(tmp_path):
    return _wordnet(tmp_path / "wordnet"), _fortunes(tmp_path / "fortunes")


def test_read_wordnet_keeps_named_and_familiar_senses(sources):
    senses = {s.word: s for s in wp.read_wordnet(sources[0])}
    assert "flux gate widget" not in senses  # a common noun absent from WordNet's tagged corpus
    assert set(senses) == {s[2].replace("_", " ") for s in SENSES[:-1]}
    assert senses["Ada Lovelace"] == wp.Sense("Ada Lovelace", "English mathematician (1815-1852)", 18, True)
    assert senses["kettle"] == wp.Sense("kettle", "a metal pot for boiling water", 6, False)
    assert not senses["carpenter"].named and senses["Oslo"].named
    assert len(wp.read_wordnet(sources[0], common_only=False)) == len(SENSES)


def test_read_fortunes_skips_indexes_art_and_fragments(sources):
    assert wp.read_fortunes(sources[1]) == [" ".join(LONG.split()), SHORT]
    assert wp.read_fortunes(sources[1] / "de") == GERMAN


def test_prompts_are_distinct_deterministic_and_cover_every_kind(sources):
    rows = wp.build_wordnet_prompts(80, wordnet_dir=sources[0], fortune_dir=sources[1])
    assert [r["id"] for r in rows] == [f"w{i:05d}" for i in range(80)]
    assert len({r["prompt"] for r in rows}) == 80
    assert rows == wp.build_wordnet_prompts(80, wordnet_dir=sources[0], fortune_dir=sources[1])
    assert rows != wp.build_wordnet_prompts(80, seed=1, wordnet_dir=sources[0], fortune_dir=sources[1])
    kinds = {r["category"] for r in rows}
    assert kinds == {"writing", "reasoning", "roleplay", "coding", "extraction", "qa", "translation",
                     "summarization", "rag", "math_reasoning"}
    for row in rows:
        text = row["prompt"]
        if row["category"] == "translation":
            assert any(g in text for g in GERMAN)
        if row["category"] == "summarization":  # only the long entries make documents
            assert LONG in text and SHORT not in text
        if row["category"] == "rag":  # the question's answer is one of the context's definitions
            subject = text.rsplit("is ", 1)[-1].rsplit("was ", 1)[-1].rstrip("?")
            assert f"{subject[0].upper()}{subject[1:]}: " in text
        if row["category"] == "roleplay":
            assert "carpenter" in text  # the only common person noun
    assert "flux gate widget" not in json.dumps(rows)


def test_exhausted_pools_and_missing_packages_are_clear_errors(tmp_path):
    tiny = _wordnet(tmp_path / "tiny", SENSES[9:10])  # one abstract noun, no fortunes: a handful of prompts
    empty = tmp_path / "no-fortunes"
    empty.mkdir()
    with pytest.raises(ValueError, match="only [0-9]+ distinct prompts can be built"):
        wp.build_wordnet_prompts(50, wordnet_dir=tiny, fortune_dir=empty)
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        wp.build_wordnet_prompts(5, wordnet_dir=tmp_path / "nowhere", fortune_dir=empty)
    with pytest.raises(FileNotFoundError, match="apt-get install fortunes"):
        wp.build_wordnet_prompts(5, wordnet_dir=tiny, fortune_dir=tmp_path / "nowhere")


def test_command_reads_the_machine_folders_or_the_given_ones(sources, monkeypatch, tmp_path, capsys):
    """``python -m tools.prompts wordnet N|A-B`` writes rows A..B-1 of the list (ids kept), from the machine's
    folders or ``--wordnet-dir`` / ``--fortune-dir``; missing or exhausted sources exit with the reason."""
    monkeypatch.setattr(wp, "WORDNET_DIR", sources[0])
    monkeypatch.setattr(wp, "FORTUNE_DIR", sources[1])
    every = wp.build_wordnet_prompts(12)
    assert every == wp.build_wordnet_prompts(12, wordnet_dir=sources[0], fortune_dir=sources[1])
    assert build_rows("wordnet", 0, 12) == every
    assert build_rows("wordnet", 5, 12) == every[5:]
    out = tmp_path / "wn.jsonl"
    assert main(["wordnet", "5-12", "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == every[5:]
    assert main(["wordnet", "12", "--without", "qa", "--without", "rag", "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        r for r in every if r["category"] not in ("qa", "rag")]
    with pytest.raises(ValueError, match="--passages only feeds the context list; wordnet builds its own texts"):
        build_rows("wordnet", 0, 3, passages=[tmp_path / "answers.jsonl"])

    monkeypatch.setattr(wp, "WORDNET_DIR", tmp_path / "nowhere")
    assert main(["wordnet", "4", "--wordnet-dir", str(sources[0]), "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == every[:4]
    for args, message in ((["wordnet", "3"], "WordNet not found at .*apt-get install wordnet-base"),
                          (["wordnet", "500", "--wordnet-dir", str(_wordnet(tmp_path / "tiny", SENSES[9:10]))],
                           "only [0-9]+ distinct prompts can be built")):
        with pytest.raises(SystemExit) as exit_:
            main([*args, "--out", str(tmp_path / "none.jsonl")])
        assert exit_.value.code == 2
        assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "none.jsonl").exists()


@pytest.mark.skipif(not (wp.WORDNET_DIR / "data.noun").is_file() or not wp.FORTUNE_DIR.is_dir(),
                    reason="Debian's wordnet-base and fortunes are not installed here")
def test_machine_prompts_never_include_spec_bench_questions():
    turns = {t for line in DATASET.open() for t in json.loads(line)["turns"]}
    rows = wp.build_wordnet_prompts(3200)
    assert len(rows) == 3200 and not turns & {r["prompt"] for r in rows}
