"""``hf_speculative.bench.magicdec_projection`` (``hf-speculative project GRID --profile P --magicdec``): MagicDec's
measured acceptance projected onto a GPU by bytes over bandwidth. The math on shapes and cells computed by hand here,
a grid and a profile written by each test, the command line, and bad input."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from hf_speculative.bench import magicdec_projection as M
from hf_speculative.cli.main import app

# a toy target: 1,000 weight bytes a forward, 10 bytes of keys and values a token
TOY = M.Shape("toy", dtype_bytes=2, weight_bytes=1000, stored_bytes=1000, kv_bytes=10, attention=4)
FORMAT = "hf-speculative-profile/1"


# -- the math -------------------------------------------------------------------------------------------------
def test_expected_tokens():
    assert M.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert M.expected_tokens(0.0, 4) == 1.0 and M.expected_tokens(1.0, 4) == 5.0


def test_a_cell_whose_cache_outweighs_the_weights_pays():
    """8 rows of 1,000 tokens: a plain step reads 1,000 + 8 x 1,000 x 10 = 81,000 bytes, draft steps 1,000 + 8 x 10 x
    10 = 1,800 then 1,880 (the first draft's keys); a chain of 2 keeps 1 + 0.8 + 0.64 tokens a row."""
    cell = M.project_cell(TOY, M.Device(1.0), 0.8, batch=8, context=1000, slots=10, num_tokens=2)
    assert cell["status"] == "pays" and cell["n"] == 2
    assert cell["speedup"] == pytest.approx(2.44 * 81000 / (81000 + 1800 + 1880))  # 2.33, above n = 1's 1.76
    assert cell["plain_step_ms"] == pytest.approx(81000 * 1e3)
    # the bandwidth cancels without an overhead or a compute floor
    assert M.project_cell(TOY, M.Device(123.0), 0.8, 8, 1000, 10, 2)["speedup"] == pytest.approx(cell["speedup"])


def test_a_cell_whose_weights_dominate_declines():
    """One row of 20 tokens: 1,200 bytes a plain step, 1,100 a draft step: nothing pays even at 80% acceptance."""
    cell = M.project_cell(TOY, M.Device(1.0), 0.8, batch=1, context=20, slots=10, num_tokens=2)
    assert cell["status"] == "declines" and cell["n"] == 0 and cell["best_chain"] == 1
    assert cell["speedup"] == pytest.approx(1.8 * 1200 / (1200 + 1100))


def test_no_acceptance_declines_and_full_acceptance_is_the_bound():
    none = M.project_cell(TOY, M.Device(1.0), 0.0, batch=8, context=1000, slots=10, num_tokens=4)
    assert none["status"] == "declines" and none["speedup"] == pytest.approx(81000 / (81000 + 1800))
    bound = M.project_cell(TOY, M.Device(1.0), 1.0, batch=8, context=1000, slots=10, num_tokens=4)
    drafts = sum(1000 + 8 * (10 + j) * 10 for j in range(4))
    assert bound["n"] == 4 and bound["speedup"] == pytest.approx(5 * 81000 / (81000 + drafts))


def test_a_context_within_the_compressed_cache_drafts_nothing():
    cell = M.project_cell(TOY, M.Device(1.0), 1.0, batch=8, context=10, slots=10, num_tokens=4)
    assert cell["status"] == "uncompressed" and cell["speedup"] is None


def test_a_host_overhead_and_a_compute_floor():
    """Each forward pays ``h`` on top; with FLOP/s given, a forward takes the longer of its bytes and its FLOPs (2 W / e
    + 4 c L H d a token: 1,000 + 4 x 1,000 x 4 = 17,000 for the verification at 1,000 tokens)."""
    slow = M.project_cell(TOY, M.Device(1.0, overhead=10_000.0), 0.8, batch=8, context=1000, slots=10, num_tokens=1)
    assert slow["speedup"] == pytest.approx(1.8 * 91000 / (91000 + 11800))
    assert slow["plain_step_ms"] == pytest.approx(91000 * 1e3)
    floor = M.Device(1.0, flops=0.5)
    assert floor.seconds(TOY, 81000, 16, 1000) == pytest.approx(16 * 17000 / 0.5)  # compute-bound
    assert floor.seconds(TOY, 81000, 1, 10) == pytest.approx(81000)  # 1,160 FLOPs take 2,320 s: memory-bound
    assert M.Device(1.0, flops=1e9).seconds(TOY, 81000, 16, 1000) == pytest.approx(81000)  # memory-bound


def test_the_nearest_measured_cell():
    cells = {(512, 1): 0, (2048, 8): 0, (4096, 1): 0, (4096, 8): 0}
    assert M.nearest_cell(cells, 32768, 64) == (4096, 8)
    assert M.nearest_cell(cells, 1024, 4) == (2048, 8)  # 512 and 2,048 as near: the longer context
    assert M.nearest_cell(cells, 4096, 4) == (4096, 8) and M.nearest_cell(cells, 4096, 2) == (4096, 1)


def test_device_memory_from_its_name():
    assert M.device_memory_gb("NVIDIA H100 80GB HBM3") == 80.0 and M.device_memory_gb("NVIDIA H200") == 141.0
    assert M.device_memory_gb("NVIDIA A10") is None


# -- shapes, the grid and the profile -------------------------------------------------------------------------
def tiny_config(folder, **fields):
    """A Llama of 2 layers, 4 heads of 16 (2 key-value heads), MLP 128, vocabulary 100."""
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": False,
              **fields}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_the_shape_of_a_config_counts_by_hand(tmp_path):
    layer = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3 + 2 * 64  # q, o; k, v; gate, up, down; two norms
    shape = M.target_shape(tiny_config(tmp_path), "bfloat16")
    assert shape.name == tmp_path.name and shape.kv_bytes == 2 * 2 * 2 * 16 * 2
    assert shape.weight_bytes == 2 * (2 * layer + 64 + 100 * 64 + 64)  # final norm, lm_head, one embedding row
    assert shape.stored_bytes == 2 * (2 * layer + 64 + 2 * 100 * 64) and shape.attention == 2 * 4 * 16
    tied = M.target_shape(tiny_config(tmp_path, tie_word_embeddings=True), "float32")
    assert tied.weight_bytes == tied.stored_bytes == 4 * (2 * layer + 64 + 100 * 64)


def grid(path, cells=((4096, 8, 10, 8), (4096, 8, 30, 24), (4096, 8, 0, 0), (2048, 1, 10, 2)), method=M.ALWAYS):
    """A grid JSONL: a greedy record and a ``method`` record per (context, batch, drafted, accepted)."""
    rows = [{"model": "smollm2-135m-instruct", "context": 4096, "batch_size": 8, "method": "greedy"}]
    rows += [{"model": "smollm2-135m-instruct", "context": c, "batch_size": b, "method": method, "drafted": d,
              "accepted": a, "options": {"window": 512, "sinks": 4}} for c, b, d, a in cells]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def profile(path, label="smollm2-135m (random weights)", device="NVIDIA H100 80GB HBM3", seconds=0.002):
    data = {"format": FORMAT, "label": label, "device": device, "dtype": "bfloat16",
            "seconds": {"2048": {"chain": {"0": 2 * seconds}}, "512": {"chain": {"0": seconds}}},
            "relative": {"512": {"chain": {"0": 1.0}}, "2048": {"chain": {"0": 1.0}}}}
    path.write_text(json.dumps(data))
    return path


def test_acceptance_is_pooled_over_the_cells_repeats(tmp_path):
    cells = M.acceptance(M.load_grid(grid(tmp_path / "g.jsonl")))
    assert cells == {(2048, 1): {"alpha": 0.2, "drafted": 10, "accepted": 2},
                     (4096, 8): {"alpha": 0.8, "drafted": 40, "accepted": 32}}  # the cell that drafted nothing: out


def test_project_a_grid_onto_a_profile(tmp_path):
    """The profile's effective bandwidth (its model's bytes at its shortest context over its forward, less the
    overhead), the device's memory from its name, each cell as :func:`project_cell` computes it."""
    records = M.load_grid(grid(tmp_path / "g.jsonl"))
    data = json.loads(profile(tmp_path / "p.json").read_text())
    smol = M.target_shape("smollm2-135m", "bfloat16")
    result = M.project(records, data, overhead_ms=1.0, batches=(1, 64), contexts=(2048, 32768))
    assert result["target"] == "smollm2-135m" and result["memory_gb"] == 80.0
    assert result["bandwidth_gbs"] == pytest.approx((smol.weight_bytes + 512 * smol.kv_bytes) / 0.001 / 1e9)
    assert "acceptance measured on the CPU with smollm2-135m-instruct" in result["label"]
    device = M.Device(result["bandwidth_gbs"] * 1e9, 0.001)
    by_cell = {(c["context"], c["batch"]): c for c in result["cells"]}
    for (context, batch), alpha, source in (((2048, 1), 0.2, [2048, 1]), ((32768, 64), 0.8, [4096, 8])):
        expected = M.project_cell(smol, device, alpha, batch, context, 516, 4)
        assert by_cell[context, batch]["speedup"] == pytest.approx(expected["speedup"])
        assert by_cell[context, batch]["alpha_from"] == source
    assert by_cell[2048, 1]["status"] == "declines" and by_cell[32768, 64]["status"] == "pays"
    # a target given, its memory checked: 0.5 GB holds a row of 2,048 tokens of the tiny Llama, not 64 of 32k (0.55 GB)
    tiny = M.target_shape(tiny_config(tmp_path), "bfloat16")
    result = M.project(records, data, config=tmp_path / "config.json", bandwidth_gbs=1000.0, memory_gb=0.5,
                       batches=(1, 64), contexts=(2048, 32768))
    need = tiny.stored_bytes + 64 * (32768 + 516) * tiny.kv_bytes
    cells = {(c["context"], c["batch"]): c for c in result["cells"]}
    assert need > 0.5e9 and cells[32768, 64] == {"batch": 64, "context": 32768, "status": "exceeds memory", "n": 0,
                                               "speedup": None, "memory_gb": need / 1e9}
    assert cells[2048, 1]["status"] != "exceeds memory" and result["bandwidth_from"] == "given (--bandwidth-gbs)"
    text = M.format_markdown(result)
    assert "**A cost model: bytes over bandwidth, acceptance measured on the CPU with" in text
    assert f"| 32,768 | {M._cell_text(cells[32768, 1])} | exceeds ({need / 1e9:.0f} GB) |" in text


# -- the command line -----------------------------------------------------------------------------------------
@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.mark.parametrize("flag", [[], ["--magicdec"]])
def test_cli_projects_a_grid(cli, tmp_path, flag):
    """A grid is detected from its records (or named with --magicdec); the table printed, JSON and markdown written."""
    args = [grid(tmp_path / "g.jsonl"), "--profile", profile(tmp_path / "p.json"), "--config",
            tiny_config(tmp_path), "--bandwidth-gbs", "3000", *flag]
    result = cli("project", *args, "--out", tmp_path / "out" / "proj")
    assert result.exit_code == 0, result.output
    assert "# MagicDec projected on NVIDIA H100 80GB HBM3" in result.output and "| 32,768 |" in result.output
    saved = json.loads((tmp_path / "out" / "proj.json").read_text())
    assert saved["format"] == M.FORMAT and saved["bandwidth_gbs"] == pytest.approx(3000.0)
    assert len(saved["cells"]) == len(M.BATCHES) * len(M.CONTEXTS)
    assert (tmp_path / "out" / "proj.md").read_text() == M.format_markdown(saved)


@pytest.mark.parametrize("case, message", [
    ("no always", ("holds no magicdec-always records (its acceptance is what is projected): run "
                   "benchmarks/magicdec_grid.py with --methods magicdec-always")),
    ("drafted nothing", "drafted nothing, so they measured no acceptance"),
    ("missing field", "line 2 has no drafted; pass the --out JSONL of benchmarks/magicdec_grid.py"),
    ("not json", "is not a MagicDec grid"),
    ("unknown config", "--config gpt-5: give a transformers config.json (a path) or one of llama-3.1-8b"),
    ("sliding", "layers other than full attention (['full_attention', 'sliding_attention']); MagicDec refuses them"),
    ("profile of a loaded model", ("its bytes per forward are unknown here: give the device's bandwidth with "
                                   "--bandwidth-gbs")),
    ("no target", "is not a shipped config: give the target's shape with --config"),
    ("overhead too long", "is no longer than the overhead given (5.00 ms): lower --overhead-ms"),
    ("bad bandwidth", "--bandwidth-gbs 0.0: give a finite number above 0"),
    ("bench options", "--draft-cost and --loop-cost project a benchmark's steps"),
    ("grid options on a bench", "--config, --memory-gb: only for a MagicDec grid; add --magicdec"),
])
def test_cli_errors_name_the_fix(cli, tmp_path, case, message):
    path = grid(tmp_path / "g.jsonl", method="magicdec" if case == "no always" else M.ALWAYS,
                cells=((4096, 8, 0, 0),) if case == "drafted nothing" else ((4096, 8, 10, 8),))
    if case == "missing field":
        path.write_text(path.read_text().replace('"drafted": 10, ', ""))
    if case == "not json":
        path.write_text("{not json\n")
    label = "smollm2-135m-instruct" if case in ("profile of a loaded model", "no target") else \
        "smollm2-135m (random weights)"
    prof = profile(tmp_path / "p.json", label=label)
    config = {"unknown config": ["--config", "gpt-5"],
              "sliding": ["--config", tiny_config(tmp_path / "sliding", layer_types=["full_attention", "sliding_attention"],
                                                  model_type="qwen2", use_sliding_window=True, sliding_window=16)],
              "profile of a loaded model": ["--config", tiny_config(tmp_path)],
              "overhead too long": ["--overhead-ms", "5"], "bad bandwidth": ["--bandwidth-gbs", "0"],
              "bench options": ["--draft-cost", "0"]}.get(case, [])
    first = [path, "--magicdec"] if case == "not json" else [path]
    if case == "grid options on a bench":
        (tmp_path / "b.jsonl").write_text(json.dumps({"method": "greedy", "question_id": 1}) + "\n")
        first, config = [tmp_path / "b.jsonl"], ["--config", "llama-3.1-8b", "--memory-gb", "80"]
    result = cli("project", *first, "--profile", prof, *config)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_the_committed_grid_projects_onto_the_profiles_shape():
    """The repository's own grid and H100 profile load, and every cell is projected or flagged: 64 rows of 32k tokens
    of Llama-3.1-8B (16.06 GB of weights, 128 KiB of keys and values a token) need 295 GB, beyond the 80 GB."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    records = M.load_grid(root / "benchmarks/results/magicdec/grid.jsonl")
    data = json.loads((root / "benchmarks/results/gpu/profile_eager_llama-3.1-8b.json").read_text())
    result = M.project(records, data, batches=(1, 64), contexts=(1024, 32768))
    assert result["target"] == "llama-3.1-8b" and result["kv_bytes"] == 32 * 2 * 8 * 128 * 2
    assert result["memory_gb"] == 80.0 and result["device"] == data["device"]
    cells = {(c["context"], c["batch"]): c for c in result["cells"]}
    need = result["stored_bytes"] + 64 * (32768 + 516) * result["kv_bytes"]
    assert cells[32768, 64]["status"] == "exceeds memory" and cells[32768, 64]["memory_gb"] == pytest.approx(need / 1e9)
    projected = [c for c in result["cells"] if c["status"] != "exceeds memory"]
    assert len(projected) == 3 and all(c["status"] in ("pays", "declines") and math.isfinite(c["speedup"])
                                       for c in projected)
