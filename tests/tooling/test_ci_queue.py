"""CI's test queue (.ci/run, tools/ci/test_queue.sh): both transformers versions run every test group of the
Makefile once, two workers share the queue, and a failed group fails the run after all groups ran."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def makefile_groups(name: str = "TEST_GROUPS") -> list[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{name} \?= (.*?)\n(?=\S)", text, re.S | re.M)
    return shlex.split(match.group(1).replace("\\\n", " "))


def ci_jobs() -> list[str]:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    tests = re.search(r"^TESTS=(\S+)$", text, re.M).group(1)
    call = re.search(r'^tools/ci/test_queue\.sh "\$logs" (.*?) \|\| status=1$', text, re.S | re.M).group(1)
    return shlex.split(call.replace("\\\n", " ").replace("$TESTS", tests))


def paths(groups: list[str]) -> list[str]:
    return sorted(path for group in groups for path in group.split("+"))


def test_cis_shell_scripts_parse():
    """``bash -n`` over CI's scripts: a comment line that lost its ``#`` (one did, with an unmatched quote) stops
    .ci/run with a syntax error where no test here executes it."""
    for script in [ROOT / ".ci" / "run", *sorted((ROOT / "tools" / "ci").glob("*.sh"))]:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{script}: {done.stderr}"


def test_every_test_folder_is_in_a_makefile_group():
    folders = {f"tests/{p.parent.relative_to(ROOT / 'tests').parts[0]}" for p in (ROOT / "tests").rglob("test_*.py")
               if p.parent != ROOT / "tests"}
    assert folders | {"tests/test_*.py"} == set(paths(makefile_groups()))


def test_ci_runs_every_makefile_group_once_on_5x_and_the_version_groups_on_4x():
    """5.x runs every group of the Makefile once; 4.x runs ``make test-4x``'s VERSION_GROUPS once, which hold the
    folders that drive the library through transformers (its models, caches, generate and training)."""
    jobs = ci_jobs()
    on = {version: [job.split(":", 1)[1] for job in jobs if job.split(":", 1)[0] == version] for version in "45"}
    assert paths(on["5"]) == paths(makefile_groups())
    assert paths(on["4"]) == paths(makefile_groups("VERSION_GROUPS"))
    assert {"tests/hf", "tests/core", "tests/drafters", "tests/training", "tests/cpu"} <= set(paths(on["4"]))
    assert set(paths(on["4"])) < set(paths(on["5"]))
    assert {job.split(":", 1)[0] for job in jobs} == {"4", "5"}


def test_make_test_4x_is_cis_4x_run():
    """``make test-4x`` (the README's 4.x command) runs VERSION_GROUPS in .venv-tf4 with the queue's 4.x marks."""
    lines = _dry_run("test-4x")
    queue = (ROOT / "tools" / "ci" / "test_queue.sh").read_text(encoding="utf-8")
    mark = re.search(r'TF4=\(VENV=\.venv-tf4 TRANSFORMERS_SPEC="(\S+)" TEST_MARK="([^"]+)"\)', queue)
    assert mark, "tools/ci/test_queue.sh's TF4 line"
    line = lines[0]  # the recipe's first command (its one line)
    assert "VENV=.venv-tf4" in line and f'TRANSFORMERS_SPEC="{mark.group(1)}"' in line
    assert f'TEST_MARK="{mark.group(2)}"' in line
    five = re.search(r'TF5=\(TEST_MARK="([^"]+)"\)', queue)
    assert five and "arch_rotated" not in five.group(1), "5.x runs the whole edge-case matrix (tests/hf/conftest.py)"
    assert shlex.split(line.split("TEST_GROUPS=", 1)[1]) == [" ".join(makefile_groups("VERSION_GROUPS"))]


def _dry_run(*args: str) -> list[str]:
    """The lines ``make -n ARGS`` prints, without the caller's make: CI runs this test inside ``make test VENV=...
    TEST_MARK=...``, whose nested makes would print "Entering directory" first, and whose command-line variables are
    in the environment, where the Makefile's ``?=`` would take them."""
    defaults = set(re.findall(r"^(\w+) \?=", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))
    caller = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"} | defaults
    env = {key: value for key, value in os.environ.items() if key not in caller}
    done = subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _pytest_lines(*args: str) -> list[str]:
    """The pytest commands ``make -n ARGS`` would run, one per test group."""
    return [line for line in _dry_run(*args) if "-m pytest" in line]


def test_make_test_leaves_out_the_slow_tests_as_ci_does():
    """The README's command (``make test``) runs the fast default, ``-m "not slow"``, CI's 5.x selection but for the
    timing tests it runs alone; ``make test-slow`` runs the slow ones, ``make test-all`` everything."""
    queue = (ROOT / "tools" / "ci" / "test_queue.sh").read_text(encoding="utf-8")
    five = re.search(r'TF5=\(TEST_MARK="([^"]+)"\)', queue).group(1)
    default = _pytest_lines("test")
    assert default and all('-m "not slow"' in line for line in default)
    assert five == "not slow and not timing"
    assert all('-m "slow"' in line for line in _pytest_lines("test", "TEST_MARK=slow"))
    assert all('-m "' not in line for line in _pytest_lines("test", "TEST_MARK="))
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r'^test-slow:\n\t\$\(MAKE\) test TEST_MARK="slow"$', text, re.MULTILINE)
    assert re.search(r"^test-all:\n\t\$\(MAKE\) test TEST_MARK=$", text, re.MULTILINE)


def test_the_queue_runs_each_job_once_and_fails_after_all_ran(tmp_path):
    """A fake ``make`` records its arguments; one group fails: every job still runs once, the queue exits 1."""
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "calls.txt"
    (fake / "make").write_text(f'#!/bin/sh\necho "$*" >> {record}\ncase "$*" in *tests/b*) exit 3;; esac\n'
                               'case "$1" in install) exit 0;; esac\nsleep 0.2\n')
    (fake / "make").chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir()
    jobs = ["5:tests/a", "4:tests/a", "5:tests/b", "4:tests/c+tests/d", "5:tests/test_*.py"]
    done = subprocess.run([str(ROOT / "tools" / "ci" / "test_queue.sh"), str(logs), *jobs], cwd=tmp_path,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, done.stderr
    calls = record.read_text().splitlines()
    assert [call.startswith("install") for call in calls[:2]] == [True, True]  # both venvs first, in turn
    calls = calls[2:]
    assert len(calls) == len(jobs)
    assert sorted(call.split("TEST_GROUPS=")[1].split(" PYTEST_OPTS=")[0] for call in calls) == sorted(
        f'"{job.split(":", 1)[1]}"' for job in jobs)
    tf4 = [call for call in calls if "VENV=.venv-tf4" in call and "TEST_GROUPS" in call]
    assert len(tf4) == 2 and all("TEST_MARK=not single_version and not slow and not timing" in call
                                  for call in tf4)
    assert all("TEST_MARK=not slow and not timing" in call for call in calls if "VENV=.venv-tf4" not in call)
    queue = (logs / "queue.txt").read_text().splitlines()
    assert len(queue) == len(jobs) and sum(line.startswith("FAIL") for line in queue) == 1
    assert len(list(logs.glob("*-tf*.log"))) == len(jobs)
    # each group's JUnit report of its tests' times beside its log (python -m tools.ci.test_times LOGDIR)
    reports = sorted(call.split("PYTEST_OPTS=--junitxml=")[1].split()[0] for call in calls)
    assert reports == sorted(str(log.with_suffix(".xml")) for log in logs.glob("*-tf*.log"))


def test_each_group_passes_pytest_opts_to_its_pytest():
    lines = _pytest_lines("test", "PYTEST_OPTS=--junitxml=/tmp/x.xml")
    assert lines and all("--junitxml=/tmp/x.xml" in line for line in lines)


def test_ci_logs_what_shares_the_cores_and_stops_logging_when_it_ends():
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    sampler = text.index('top -b -n 1 -o %CPU')
    assert text.index("logs=$(mktemp -d)") < sampler < text.index("fresh=$(mktemp -d)")  # from the start
    assert ">/dev/null 2>&1 &" in text[sampler:sampler + 300]  # CI's output is not held open by it
    assert "trap 'kill \"$top_pid\" 2>/dev/null' EXIT" in text


def test_timing_tests_run_alone_after_everything_else():
    """Tests that compare measured times (the ``timing`` marker) are left out of the queue and run once the queue,
    the OpenVINO and vLLM checks (beside the queue, after their installs) and the fresh-machine check have finished:
    alone on the machine."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    timing = text.index('make test PYTEST_ARGS="-m timing tests/bench"')
    assert timing > max(text.index("tools/ci/test_queue.sh \"$logs\""), text.index('wait "$extras_pid"'),
                        text.index('wait "$fresh_pid"'))
    extras = text[text.index("extras() {"):text.index("extras &")]  # the background run: installs, then checks
    assert extras.index("make install-vllm") < extras.index("-m openvino") < extras.index("-m vllm")
    assert "timing:" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # a registered marker


def test_cis_venvs_skip_pips_compiling_and_the_fresh_machine_check_does_not():
    """CI's own installs pass ``--no-compile`` to pip (the Makefile's PIP_FLAGS) to every pip install; the
    fresh-machine check installs as a newcomer does."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'PIP=(PIP_FLAGS="--quiet --no-compile")' in text
    installs = re.findall(r"^\s*(?:if )?make (install\S*)(.*)$", text, re.MULTILINE)
    assert {name for name, _ in installs} == {"install", "install-openvino", "install-vllm"}
    assert all('"${PIP[@]}"' in rest for _, rest in installs), installs
    assert "--no-compile" not in (ROOT / "tools" / "ci" / "fresh_machine.sh").read_text(encoding="utf-8")
    for target in ("install", "install-openvino", "install-vllm"):
        pips = [line for line in _dry_run(target, "VENV=/nonexistent-venv", "OV_VENV=/nonexistent-ov",
                                          "VLLM_VENV=/nonexistent-vllm", "PIP_FLAGS=--quiet --no-compile")
                if " -m pip install " in line]
        assert pips and all("--no-compile" in line for line in pips), (target, pips)


def test_the_fresh_machine_check_starts_before_cis_installs():
    """The fresh-machine check (its own clone, venvs and model caches) starts first, beside CI's installs, which run
    one at a time on one core. (That it ends before the timing tests: ``test_timing_tests_run_alone_after_...``.)"""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    started = text.index("tools/ci/fresh_machine.sh both) >")
    assert started < text.index('make install "${PIP[@]}"') < text.index("tools/ci/test_queue.sh \"$logs\"")
