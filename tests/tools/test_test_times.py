"""tools/ci/test_times.py: a CI run's JUnit reports summed by file and by test, the two versions apart."""

from __future__ import annotations

import pytest

from tools.ci.test_times import case_times, main, summarize

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.core.test_a" name="test_one" time="2.5" />
<testcase classname="tests.core.test_a" name="test_two[x]" time="1.0" />
<testcase classname="tests.hf.test_b" name="test_three" time="7.25"><skipped message="no" /></testcase>
</testsuite></testsuites>"""


def test_files_and_tests_are_summed_per_version(tmp_path, capsys):
    (tmp_path / "00-tf5-tests_core.xml").write_text(REPORT)
    (tmp_path / "01-tf4-tests_core.xml").write_text(REPORT.replace('time="7.25"', 'time="0.5"'))
    assert case_times(tmp_path / "00-tf5-tests_core.xml") == [
        ("tests/core/test_a.py", "test_one", 2.5), ("tests/core/test_a.py", "test_two[x]", 1.0),
        ("tests/hf/test_b.py", "test_three", 7.25)]
    lines = summarize(tmp_path).splitlines()
    assert lines[0].split()[-4:] == ["10.8", "s", "3", "tests"] and lines[1].split()[-4:] == ["4.0", "s", "3", "tests"]
    assert lines[2].split() == ["all", "groups", "14.8", "s"]
    ranked = [line.split() for line in lines[4:]]
    assert [row[-2:] for row in ranked] == [["tf5", "tests/hf/test_b.py"], ["tf5", "tests/core/test_a.py"],
                                            ["tf4", "tests/core/test_a.py"], ["tf4", "tests/hf/test_b.py"]]
    assert ranked[1][:2] == ["3.5", "s"] and ranked[1][3] == "2"  # two tests, 3.5 s
    assert main([str(tmp_path), "--by", "test", "--top", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[-2:] == ["tf5", "tests/hf/test_b.py::test_three"]


def test_a_folder_without_reports_says_what_writes_them(tmp_path):
    with pytest.raises(SystemExit, match="no JUnit reports"):
        summarize(tmp_path)
