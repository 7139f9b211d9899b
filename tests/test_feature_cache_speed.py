"""benchmarks/feature_cache_speed.py runs end to end on a tiny saved model: every setting (batch size, stock or fast
CPU path) caches the same examples once per repeat, and the figures it reports are the ones it measured."""

from __future__ import annotations

import json

from tests.conftest import load_benchmark


def test_feature_cache_speed_script(tmp_path, chat_checkpoint, capsys):
    module = load_benchmark("feature_cache_speed")
    data = tmp_path / "answers.jsonl"
    rows = [{"id": f"q{i}", "prompt_tokens": [1, 4] + [6 + (i + j) % 20 for j in range(3 + i % 7)] + [5],
             "response_tokens": [6 + (i * j) % 20 for j in range(4 + i % 5)] + [2]} for i in range(10)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = module.main(["--model", str(chat_checkpoint), "--data", str(data), "--examples", "8",
                           "--batch-tokens", "1,64", "--threads", "1", "--paths", "stock,fast", "--repeats", "2"])
    assert [(r["batch_tokens"], r["path"]) for r in results] == [(1, "stock"), (1, "fast"), (64, "stock"), (64, "fast")]
    assert all(r["seconds"] > 0 and abs(r["examples_per_s"] * r["seconds"] - 8) < 1e-6 for r in results)
    assert all(len(r["runs"]) == 2 and min(r["runs"]) <= round(r["seconds"], 2) <= max(r["runs"]) for r in results)
    out = capsys.readouterr().out
    assert "8 examples" in out and "layers [1, 0, 0]" in out and "batch_tokens 64, fast:" in out
