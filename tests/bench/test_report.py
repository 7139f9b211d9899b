"""Report aggregation checked against hand-computed figures on a handcrafted jsonl."""

import json

import pytest

from hf_speculative.bench.report import format_report, load_records, markdown_table, summarize, write_report


def rec(method, category, qid, new_tokens, seconds, forwards=None, drafted=None, accepted=None, same=True, run="r1"):
    return {
        "run_id": run,
        "model": "tiny",
        "method": method,
        "category": category,
        "question_id": qid,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "tokens_per_s": new_tokens / seconds,
        "tau": new_tokens / forwards if forwards else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "target_forwards": forwards,
        "drafted": drafted,
        "accepted": accepted,
        "identical_to_greedy": same,
        "threads": 1,
        "max_new_tokens": 100,
    }


RECORDS = [
    # prompt a1: greedy 100 tok / 10 s (10 tok/s)
    rec("greedy", "a", 1, 100, 10.0, forwards=100),
    rec("pl", "a", 1, 100, 5.0, forwards=40, drafted=80, accepted=60),  # 20 tok/s
    rec("hf", "a", 1, 100, 8.0, forwards=50),  # 12.5 tok/s
    # prompt a2: greedy 50 tok / 10 s (5 tok/s)
    rec("greedy", "a", 2, 50, 10.0, forwards=50),
    rec("pl", "a", 2, 50, 2.5, forwards=10, drafted=40, accepted=40),  # 20 tok/s
    rec("hf", "a", 2, 50, 10.0, forwards=25, same=False),  # 5 tok/s
    # prompt b1: greedy 60 tok / 6 s (10 tok/s)
    rec("greedy", "b", 1, 60, 6.0, forwards=60),
    rec("pl", "b", 1, 60, 4.0, forwards=30, drafted=20, accepted=0),  # 15 tok/s
    rec("hf", "b", 1, 60, 3.0),  # 20 tok/s, forwards unknown
]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + "\n")
    return path


def rows_by_method(records, reference=None):
    return {row["method"]: row for row in summarize(records, reference)}


def test_category_aggregates_by_hand():
    rows = rows_by_method([r for r in RECORDS if r["category"] == "a"], reference="hf")
    greedy, pl, hf = rows["greedy"], rows["pl"], rows["hf"]
    assert list(rows) == ["greedy", "pl", "hf"]
    assert greedy["tokens_per_s"] == pytest.approx(150 / 20)
    assert pl["tokens_per_s"] == pytest.approx(150 / 7.5)
    assert hf["tokens_per_s"] == pytest.approx(150 / 18)
    assert greedy["speedup"] == pytest.approx(1.0)
    assert pl["speedup"] == pytest.approx(20 / 7.5)
    assert hf["speedup"] == pytest.approx((150 / 18) / 7.5)
    # per-prompt ratios: pl 20/10, 20/5 -> median 3; hf 12.5/10, 5/5 -> median 1.125
    assert pl["median_speedup"] == pytest.approx(3.0)
    assert hf["median_speedup"] == pytest.approx(1.125)
    assert pl["tau"] == pytest.approx(150 / 50) and hf["tau"] == pytest.approx(150 / 75) and greedy["tau"] == 1.0
    assert pl["acceptance_rate"] == pytest.approx(100 / 120)
    assert hf["acceptance_rate"] is None and greedy["acceptance_rate"] is None
    assert (pl["identical"], hf["identical"], hf["prompts"]) == (2, 1, 2)
    assert pl["vs_reference"] == pytest.approx(20 / (150 / 18))
    assert hf["vs_reference"] == pytest.approx(1.0)


def test_overall_aggregates_by_hand():
    rows = rows_by_method(RECORDS)
    assert rows["greedy"]["tokens_per_s"] == pytest.approx(210 / 26)
    assert rows["pl"]["speedup"] == pytest.approx((210 / 11.5) / (210 / 26))
    assert rows["pl"]["median_speedup"] == pytest.approx(2.0)  # ratios 2, 4, 1.5
    assert rows["pl"]["tau"] == pytest.approx(210 / 80)
    assert rows["pl"]["acceptance_rate"] == pytest.approx(100 / 140)
    # hf: forwards are unknown on b1, so tau only counts the prompts where they were counted
    assert rows["hf"]["tau"] == pytest.approx(150 / 75)
    assert rows["hf"]["median_speedup"] == pytest.approx(1.25)  # ratios 1.25, 1, 2
    assert rows["hf"]["identical"] == 2 and rows["hf"]["prompts"] == 3
    assert rows["pl"]["vs_reference"] is None


def test_markdown_table_formatting():
    table = markdown_table(summarize([r for r in RECORDS if r["category"] == "a"], "hf"), "hf")
    lines = table.splitlines()
    header = "| method | prompts | tokens/s | speedup | median speedup | tau | acceptance | identical | vs hf |"
    assert lines[0] == header
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|"
    assert lines[2] == "| greedy | 2 | 7.50 | 1.00× | 1.00× | 1.00 | – | 2/2 | 0.90× |"
    assert lines[3] == "| pl | 2 | 20.00 | 2.67× | 3.00× | 3.00 | 83% | 2/2 | 2.40× |"
    assert lines[4] == "| hf | 2 | 8.33 | 1.11× | 1.12× | 2.00 | – | 1/2 | 1.00× |"
    assert "vs" not in markdown_table(summarize(RECORDS))


def test_write_report_from_file(jsonl):
    assert load_records(jsonl) == RECORDS
    text, md_path = write_report(jsonl)
    assert md_path == jsonl.with_suffix(".md") and md_path.read_text() == text
    assert text.index("### a") < text.index("### b") < text.index("### overall")
    assert "## tiny (run r1)" in text
    assert "| hf | 3 | 10.00 | 1.24× | 1.25× | 2.00 | – | 2/3 |" in text  # 210 tok / 21 s; 10 / (210 / 26)


def test_runs_are_reported_separately():
    other = [dict(r, run_id="r2", model="other") for r in RECORDS[:3]]
    text = format_report(RECORDS + other)
    assert "## other (run r2)" in text
    second = text[text.index("## other") :]
    assert "### overall" not in second  # a run with one category has no separate overall table
    assert "| pl | 1 | 20.00 | 2.00× | 2.00× |" in second  # the second run's greedy is its own baseline
    assert format_report([]) == "No benchmark records.\n"


def test_a_method_that_drafted_nothing_shows_no_drafts():
    """0 accepted of 0 drafted is no rate at all: "no drafts", not 0% (and "–" stays for methods that do not
    report their drafts)."""
    records = [rec("greedy", "a", 1, 10, 1.0, forwards=10), rec("pl", "a", 1, 10, 1.0, forwards=10, drafted=0,
                                                                 accepted=0), rec("hf", "a", 1, 10, 1.0, forwards=10)]
    rows = rows_by_method(records)
    assert rows["pl"]["drafted"] == 0 and rows["hf"]["drafted"] is None and rows["greedy"]["drafted"] is None
    table = markdown_table(summarize(records))
    assert "| pl | 1 | 10.00 | 1.00× | 1.00× | 1.00 | no drafts | 1/1 |" in table
    assert "| hf | 1 | 10.00 | 1.00× | 1.00× | 1.00 | – | 1/1 |" in table


def test_write_report_of_given_records_only(jsonl):
    """``bench`` reports its own run, not every run the file holds."""
    second = [dict(r, run_id="r2") for r in RECORDS[:3]]
    with open(jsonl, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in second))
    text, md_path = write_report(jsonl, records=second)
    assert "(run r2)" in text and "(run r1)" not in text and md_path.read_text() == text
    assert "(run r1)" in write_report(jsonl)[0]  # the whole file, as `bench-report FILE` makes it


def test_a_cpu_run_reports_greedys_weight_bandwidth_under_each_table():
    """Greedy's aggregate tokens/s per table as the weights' GB/s against the run's measured read bandwidth; a run
    that recorded none (a GPU's, an older file) gets no line."""
    cpu = {"weight_bytes_per_token": 540_000_000, "read_bandwidth_gbs": 23.0, "read_bandwidth_from": "measured"}
    text = format_report([dict(r, **cpu) for r in RECORDS])
    expected = {  # greedy: a 150 tok / 20 s, b 60 tok / 6 s, overall 210 tok / 26 s; 0.54 GB a token
        "a": "weights 540 MB/token -> 4.05 GB/s at 7.5 tok/s, 18% of this machine's 23.0 GB/s single-thread read",
        "b": "weights 540 MB/token -> 5.4 GB/s at 10.0 tok/s, 23% of this machine's 23.0 GB/s single-thread read",
        "overall": "weights 540 MB/token -> 4.36 GB/s at 8.1 tok/s, 19% of this machine's 23.0 GB/s single-thread "
                   "read",
    }
    for category, line in expected.items():
        section = text[text.index(f"### {category}"):].split("###")[1]
        assert section.rstrip().endswith(f"greedy (plain decoding): {line}"), section
    assert text.count("greedy (plain decoding)") == 3
    assert "plain decoding" not in format_report(RECORDS)
