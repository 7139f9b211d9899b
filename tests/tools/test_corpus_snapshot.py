"""``python -m tools.corpus snapshot|restore``: compressed, incremental checkpoints of a corpus folder that can be
committed, restored byte for byte on another machine; parts read as untrusted input."""

from __future__ import annotations

import json
import lzma

import pytest

from tools.corpus.__main__ import main
from tools.corpus.snapshot import restore, snapshot


def _rows(start: int, stop: int) -> str:
    return "".join(json.dumps({"id": i, "seat": i, "source": "wordnet", "prompt_tokens": [1, 2, i],
                               "response_tokens": [i] * 5}) + "\n"
                   for i in range(start, stop))


@pytest.fixture
def corpus(tmp_path):
    out = tmp_path / "corpus"
    for name in ("answers", "prompts", "raw"):
        (out / name).mkdir(parents=True)
    (out / "prompts" / "train.jsonl").write_text(_rows(0, 40))
    (out / "prompts" / "held_out.jsonl").write_text(_rows(40, 42))
    (out / "answers" / "train.jsonl").write_text(_rows(0, 10) + '{"id": 10, "prom')  # a row still being written
    (out / "raw" / "magpie.jsonl").write_text(_rows(0, 5))
    (out / "raw" / "magpie.part1.jsonl").write_text(_rows(5, 7))  # a helper's unmerged rows: transient
    (out / "MANIFEST.json").write_text(json.dumps({"settings": {"mix": "wordnet=1"}, "target": {"name": "t"},
                                                   "answers_asked": 42, "answers": {"done": 10}}, indent=1))
    (out / ".lock").write_text("")
    return out


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _header(part) -> dict:
    with lzma.open(part, "rb") as f:
        return json.loads(f.readline())


def test_parts_restore_the_corpus_byte_for_byte_each_holding_only_what_was_new(tmp_path, corpus):
    snaps = tmp_path / "snaps"
    first = snapshot(corpus, snaps)
    assert first == snaps / "part-0001.jsonl.xz"
    assert snapshot(corpus, snaps) is None  # nothing new: no part
    restored = restore(snaps, tmp_path / "r1")
    assert restored["rows"] == {"answers/train.jsonl": 10, "prompts/held_out.jsonl": 2, "prompts/train.jsonl": 40,
                                "raw/magpie.jsonl": 5}
    want = _files(corpus)
    want["answers/train.jsonl"] = _rows(0, 10).encode()  # the unfinished row is left for the next part
    for transient in ("raw/magpie.part1.jsonl", ".lock"):
        del want[transient]
    assert _files(tmp_path / "r1") == want

    with open(corpus / "answers" / "train.jsonl", "w") as f:  # the build went on: its row finished, more appended
        f.write(_rows(0, 25))
    (corpus / "prompts" / "train.jsonl").write_text(_rows(100, 140))  # rewritten (a grown corpus): whole again
    (corpus / "MANIFEST.json").write_text(json.dumps({"answers_asked": 42, "answers": {"done": 25}}))
    second = snapshot(corpus, snaps)
    files = {entry["path"]: entry for entry in _header(second)["files"]}
    assert (files["answers/train.jsonl"]["start"], files["answers/train.jsonl"]["lines"]) == (10, 15)
    assert (files["prompts/train.jsonl"]["start"], files["prompts/train.jsonl"]["lines"]) == (0, 40)
    assert "raw/magpie.jsonl" not in files and "prompts/held_out.jsonl" not in files  # unchanged: not repeated
    restore(snaps, tmp_path / "r2")
    want = {name: data for name, data in _files(corpus).items() if name not in ("raw/magpie.part1.jsonl", ".lock")}
    assert _files(tmp_path / "r2") == want


def test_the_commands_snapshot_and_restore(tmp_path, corpus, capsys):
    assert main(["snapshot", "--out", str(corpus), "--to", str(tmp_path / "snaps")]) == 0
    assert "part-0001.jsonl.xz: " in capsys.readouterr().out
    assert main(["snapshot", "--out", str(corpus), "--to", str(tmp_path / "snaps")]) == 0
    assert "nothing new to add" in capsys.readouterr().out
    assert main(["restore", "--from", str(tmp_path / "snaps"), "--out", str(tmp_path / "r")]) == 0
    assert "answers/train.jsonl 10 rows" in (printed := capsys.readouterr().out)
    assert "10/42 answers (23.8%); 42/42 prompts built" in printed  # the corpus's status, read from what was restored
    with pytest.raises(SystemExit) as stop:  # never over a corpus that is there
        main(["restore", "--from", str(tmp_path / "snaps"), "--out", str(tmp_path / "r")])
    assert stop.value.code == 2 and "is not empty: restore into a new folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["snapshot", "--out", str(tmp_path / "nothing"), "--to", str(tmp_path / "snaps")])
    assert "no corpus here (no MANIFEST.json)" in capsys.readouterr().err


def _write_part(path, header: dict, rows: list[str]) -> None:
    with lzma.open(path, "wb") as f:
        f.write((json.dumps(header) + "\n" + "".join(rows)).encode())


def test_damaged_missing_or_hostile_parts_are_refused_before_anything_is_written(tmp_path, corpus):
    snaps = tmp_path / "snaps"
    snapshot(corpus, snaps)
    (corpus / "answers" / "train.jsonl").write_text(_rows(0, 12))
    snapshot(corpus, snaps)
    header, body = _header(snaps / "part-0002.jsonl.xz"), _rows(10, 12).splitlines(keepends=True)
    manifest, answers = header["files"]  # the manifest whole, the answers' two new rows

    def changed(**entry) -> dict:
        return {**header, "files": [manifest, {**answers, **entry}]}

    (snaps / "part-0001.jsonl.xz").rename(tmp_path / "away.xz")  # a missing part
    with pytest.raises(ValueError, match=r"parts \[2\] are not numbered 1, 2, 3"):
        restore(snaps, tmp_path / "r")
    (tmp_path / "away.xz").rename(snaps / "part-0001.jsonl.xz")

    cases = {
        "row changed": (header, [body[0], body[1].replace('"id": 11', '"id": 99')], "do not match the header"),
        "row added": (header, [*body, body[0]], "1 rows beyond those its header lists"),
        "row lost": (header, body[:1], "promises 2 rows, the part holds 1"),
        "another corpus": (changed(prefix_sha256="0" * 64), body,
                           "continues from row 10, which the parts before it do not restore"),
        "outside the folder": (changed(path="../escape.jsonl"), body,
                               "is not a plain relative path inside the corpus folder"),
        "absolute": ({**header, "files": [{"path": "/tmp/x", "text": "x"}]}, [], "not a plain relative path"),
        "not a part": ({"format": 7}, [], "not a corpus snapshot part of format 1"),
    }
    for case, (bad_header, rows, message) in cases.items():
        _write_part(snaps / "part-0002.jsonl.xz", bad_header, rows)
        with pytest.raises(ValueError, match=message):
            restore(snaps, tmp_path / case)
        assert not (tmp_path / case).exists(), case  # refused before any file was written
    assert not (tmp_path.parent / "escape.jsonl").exists()
    with pytest.raises(ValueError, match="no corpus snapshot parts"):
        restore(tmp_path / "empty", tmp_path / "r")
