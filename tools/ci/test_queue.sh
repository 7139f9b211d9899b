#!/usr/bin/env bash
# The README's test command (`make test`) for both transformers versions, as one queue of test groups shared by
# WORKERS processes (CI: .ci/run), so that every core stays busy until the last group: the transformers 5.x run
# alone takes twice the 4.x one, and two runs side by side left one core idle for the second half.
#
#   tools/ci/test_queue.sh LOGDIR JOB [JOB ...]        JOB = "5:GROUP" (.venv) or "4:GROUP" (.venv-tf4)
#
# GROUP is one of the Makefile's TEST_GROUPS ("+" joins paths). Jobs are claimed in the order given (put the longest
# first); each runs `make test TEST_GROUPS=GROUP` in its venv, its output in LOGDIR/NN-VERSION-GROUP.log. Neither
# version runs the `slow` tests (`make test`'s default: end-to-end versions of what fast tests check, `make test-slow`
# runs them; in CI's run of 2026-12-01 they were ~1,300 s of its 8,756 s of groups) nor the `timing` ones, which
# compare measured times and so run alone after the queue (.ci/run). 4.x (.ci/run gives it the Makefile's
# VERSION_GROUPS only, as `make test-4x` does) leaves out the `single_version` tests too (tooling whose outcome does not
# depend on transformers' version: pyproject.toml's markers) and the edge-case matrix's cells that other architectures
# cover there (`arch_rotated`, tests/hf/conftest.py). Both venvs are installed first, one after the other (two `make
# install` at once into one venv collide). Exits 1 if any group failed, after all ran.
set -uo pipefail
logdir=$1
shift
jobs=("$@")
workers=${WORKERS:-2}
claims=$(mktemp -d)
TF4=(VENV=.venv-tf4 TRANSFORMERS_SPEC="transformers==4.57.6" TEST_MARK="not single_version and not slow and not timing and not arch_rotated")
TF5=(TEST_MARK="not slow and not timing")  # `make test`'s default; the timing tests run alone after the queue (.ci/run)
make install >/dev/null || exit 1
make install "${TF4[@]}" >/dev/null || exit 1

run_job() {  # index, "VERSION:GROUP"
    local index=$1 version=${2%%:*} group=${2#*:}
    local name
    name=$(printf '%02d-tf%s-%s' "$index" "$version" "$(echo "$group" | tr '/+*' '__x')")
    local args=("${TF5[@]}")
    [ "$version" = 4 ] && args=("${TF4[@]}")
    local start=$SECONDS
    # each test's time in LOGDIR/NAME.xml (JUnit): the log's --durations shows the slowest 25 only
    if make test "${args[@]}" TEST_GROUPS="\"$group\"" PYTEST_OPTS="--junitxml=$logdir/$name.xml" \
        >"$logdir/$name.log" 2>&1; then
        echo "ok   $name $((SECONDS - start)) s" >>"$logdir/queue.txt"
    else
        echo "FAIL $name $((SECONDS - start)) s" >>"$logdir/queue.txt"
        touch "$claims/failed"
    fi
}

worker() {
    local i
    for i in "${!jobs[@]}"; do
        mkdir "$claims/$i" 2>/dev/null || continue  # mkdir is atomic: one worker claims each job
        run_job "$i" "${jobs[$i]}"
    done
}

pids=()
for _ in $(seq "$workers"); do
    worker &
    pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid"
done
status=0
[ -e "$claims/failed" ] && status=1
rm -rf "$claims"
exit $status
