#!/usr/bin/env bash
# A newcomer's first hour, on a machine with nothing cached (CI runs it: .ci/run; `make fresh-check` by hand):
#   1. `make demo` in a fresh venv with an empty model cache installs what it needs, fetches the default
#      model, serves the app, and the app answers one request through gradio_client;
#   2. the Spaces path: a venv with only requirements.txt (and gradio at README.md's sdk_version, which
#      Spaces installs itself), an empty model cache, `python app.py` started as Spaces starts it (in the
#      repository root, GRADIO_SERVER_NAME/GRADIO_SERVER_PORT and SPACE_ID set); one request answered.
# torch: the CPU wheel (torch==2.13.0 on this project's machines, TORCH_SPEC) goes in first in both venvs,
# as on a Space's base image; requirements.txt's torch>=2.4 is then satisfied (a bare resolve would pull a
# multi-GB CUDA build).
# Usage: tools/ci/fresh_machine.sh [demo|spaces|both]   (FRESH_DIR=... keeps the venvs and logs there)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
which=${1:-both}
keep=${FRESH_DIR:+1}
work=${FRESH_DIR:-$(mktemp -d /tmp/hfs-fresh.XXXXXX)}
mkdir -p "$work"
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
PYTHON=${PYTHON:-python3}
pids=()
cleanup() {
    for pid in "${pids[@]+"${pids[@]}"}"; do kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
    [ -n "$keep" ] || rm -rf "$work"  # two venvs of about 1.5 GB each
}
trap cleanup EXIT

free_port() { "$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

# wait_for_url LOG PID SECONDS: the URL the app prints once it serves, or fail with the log's tail
wait_for_url() {
    local log=$1 pid=$2 limit=$3 waited=0
    while [ "$waited" -lt "$limit" ]; do
        if url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -1) && [ -n "$url" ]; then
            echo "$url"; return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "the app exited before serving; last lines of its log:" >&2; tail -40 "$log" >&2; return 1
        fi
        sleep 2; waited=$((waited + 2))
    done
    echo "the app did not serve within ${limit}s; last lines of its log:" >&2; tail -40 "$log" >&2; return 1
}

check_demo() {
    local cache="$work/demo-cache" venv="$work/venv-demo" log="$work/demo.log" port start
    rm -rf "$cache" "$venv"; mkdir -p "$cache"
    port=$(free_port)
    start=$(date +%s)
    echo "== make demo: fresh venv $venv, empty model cache $cache, port $port"
    # a process group of its own, so that the cleanup stops make, the app and anything they started
    HF_SPECULATIVE_CACHE="$cache" setsid make demo VENV="$venv" PYTHON="$PYTHON" TORCH_SPEC="$TORCH_SPEC" \
        DEMO_ARGS="--port $port --threads 1" >"$log" 2>&1 &
    local pid=$!; pids+=("$pid")
    url=$(wait_for_url "$log" "$pid" 1800)
    echo "   serving at $url after $(( $(date +%s) - start )) s"
    "$venv/bin/python" tools/ci/first_request.py "$url"
    test -x "$venv/bin/hf-speculative" || { echo "make demo did not install the hf-speculative command" >&2; exit 1; }
    "$venv/bin/hf-speculative" --help >/dev/null
    kill -- -"$pid" 2>/dev/null || true
    echo "== make demo: OK in $(( $(date +%s) - start )) s"
}

check_spaces() {
    local cache="$work/spaces-cache" venv="$work/venv-spaces" log="$work/spaces.log" port start sdk
    rm -rf "$cache" "$venv"; mkdir -p "$cache"
    sdk=$(sed -n 's/^sdk_version: *//p' README.md | head -1)
    port=$(free_port)
    start=$(date +%s)
    echo "== Spaces: fresh venv $venv from requirements.txt + gradio==$sdk, empty model cache $cache, port $port"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$TORCH_SPEC"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt "gradio==$sdk"
    # Spaces runs `python app.py` in the repository root; the package is imported from there, not installed
    HF_SPECULATIVE_CACHE="$cache" GRADIO_SERVER_NAME=127.0.0.1 GRADIO_SERVER_PORT="$port" SPACE_ID=ci/fresh-check \
        setsid "$venv/bin/python" app.py >"$log" 2>&1 &
    local pid=$!; pids+=("$pid")
    url=$(wait_for_url "$log" "$pid" 1800)
    echo "   serving at $url after $(( $(date +%s) - start )) s"
    "$venv/bin/python" tools/ci/first_request.py "$url"
    kill -- -"$pid" 2>/dev/null || true
    echo "== Spaces: OK in $(( $(date +%s) - start )) s"
}

case "$which" in
    demo) check_demo ;;
    spaces) check_spaces ;;
    both) check_demo; check_spaces ;;
    *) echo "usage: $0 [demo|spaces|both]" >&2; exit 2 ;;
esac
