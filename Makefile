# Set-up is `make install` (any target below runs it on first use): .venv/ with exactly
# requirements.lock (every distribution by version and SHA-256, the CPU torch included); `make
# lock` regenerates the lock (tools/lock.py). Then `make demo` (convert, validate, inspect,
# smoke-run and evaluate the bundled golden drafters, Qwen3 and Gemma4: ~3 min the first time,
# 25 s after on a 2-core VM), `make test-fast` (the inner loop) and `make test` (what CI runs:
# it builds llama.cpp and installs dspark-mlx and speculators first, ~32 min from a clean clone).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
LOCK   := requirements.lock
PIP    := $(BIN)/python -m pip --disable-pip-version-check
# Compiled modules in build/pycache/ even where PYTHONDONTWRITEBYTECODE is set (CI's machines
# set it): what test and test-fast run under (else every run recompiles the package in each
# dspark child and rewrites every test module).
PYCACHE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache

.PHONY: install lock demo test test-fast schemas docs fixtures check-generated bench bench-runtime bench-serving gate fuzz clean

# The environment is the lock, nothing else: a fresh venv (--clear: no distribution of an
# earlier lock stays), the lock with --require-hashes --no-deps (pip resolves nothing: no
# registry's newer release comes in), the project itself without build isolation (which would
# fetch setuptools unpinned; the lock holds it), then pip check (the set is consistent).
# The lock's install takes minutes: tools/install_progress.py shows its progress in a few
# lines and keeps pip's whole output in .venv/pip-install.log.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) tools/lock.py --check
	$(PYTHON) -m venv --clear $(VENV)
	$(PYTHON) tools/install_progress.py $(VENV)/pip-install.log -- \
	    $(PIP) install --require-hashes --no-deps -r $(LOCK)
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(PIP) check
	touch $(STAMP)

install: $(STAMP)

# Regenerate requirements.lock from pyproject.toml's requirements (its dev extra and its build
# requirement) and constraints.txt with pip's own resolver (tools/lock.py); then `make install`.
lock:
	$(PYTHON) tools/lock.py

# The demo (tools/demo.py): 13 `dspark` commands on the bundled golden drafters (inspect,
# convert, validate, smoke against DeepSpec's own runs, Qwen3 and Gemma4; then `dspark eval`
# of the DSpark drafter against DeepSpec's plain DFlash one, report in build/demo/eval/,
# docs/eval-acceptance.png being its acceptance.png), each printed as typed and followed by
# one line of what its --json report says; run a command shown for its tables.
demo: $(STAMP)
	@$(BIN)/python tools/demo.py --out build/demo

# The whole suite, the slow tests included: what CI runs (.ci/run). It builds llama.cpp and
# installs dspark-mlx first when the cache lacks them: the engine tests run in CI and fail
# there without them.
test: $(STAMP) llama-cpp dspark-mlx speculators
	$(PYCACHE) $(BIN)/python -m pytest -q

# llama.cpp 0c1e570 from the pinned llama-cpp-python sdist (SHA-256 checked), built into
# $DSPARK_ENGINE_CACHE (default ~/.cache/dspark-convert)/llama.cpp-0c1e570/ (tools/llama_cpp.py),
# portable code (the x86-64-v3 baseline, never -march=native: docs/REFERENCE.md §6); a whole build there is
# reused, anything else there replaced. From nothing: ~1 min download, ~3-5 min build on 2 cores.
.PHONY: llama-cpp
llama-cpp: $(STAMP)
	$(BIN)/python tools/llama_cpp.py build

# dspark-mlx 0.1.0 with mlx[cpu] 0.32.4 and what they need, every wheel pinned by version and
# SHA-256 (pip install --require-hashes --no-deps; the set proved closed), into a venv in
# $DSPARK_ENGINE_CACHE (default ~/.cache/dspark-convert)/dspark-mlx-0.1.0/ (tools/dspark_mlx.py);
# a whole install there is reused (every file checked against pip's RECORD), anything else
# replaced. From nothing: about a minute or two on 2 cores.
.PHONY: dspark-mlx
dspark-mlx: $(STAMP)
	$(BIN)/python tools/dspark_mlx.py install

# speculators 0.9.0 with transformers 5.19.0 and exactly what its DSpark/DFlash classes import,
# every wheel pinned by version and SHA-256 (pip install --require-hashes --no-deps; the set
# proved closed, its declared omissions aside), into a
# venv in $DSPARK_ENGINE_CACHE (default ~/.cache/dspark-convert)/speculators-0.9.0/
# (tools/speculators.py); torch is the project's, linked in. A whole install there is reused,
# anything else replaced. From nothing: about a minute on 2 cores.
.PHONY: speculators
speculators: $(STAMP)
	$(BIN)/python tools/speculators.py install

# The inner loop (measured: 2,816 tests in 4 min 12 s on 2 quiet cores): the suite
# without the tests marked slow, on every core (pytest-xdist; a module stays in one worker,
# so its fixtures are built once), one OpenMP/OpenBLAS thread per worker unless you set them
# (more only spin against each other), compiled modules kept in build/pycache/ (PYCACHE above).
test-fast: $(STAMP)
	$(PYCACHE) \
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} \
	    $(BIN)/python -m pytest -q -m "not slow" -n auto --dist loadfile

# Regenerate checked-in outputs (tests fail when they are stale).
schemas: $(STAMP)
	$(BIN)/python tools/schemas.py
docs: $(STAMP)
	$(BIN)/python tools/docs.py
fixtures: $(STAMP)
	$(BIN)/python golden/make_fixtures.py

# Convert/validate against cp+sync, SHA-256 and an eager gguf-py converter, on synthetic
# checkpoints in /tmp/dspark-bench (kept for the next run; needs ~10 GB free); ~5 minutes.
# Writes bench/RESULTS.md (generated part) and bench/results.json.
bench: $(STAMP)
	$(BIN)/python bench/run.py

# The reference runtime at the released geometry (bench/runtime.py): all-zero Qwen3-4B and
# Qwen3-8B targets and DSpark drafters as sparse files in BENCH_RUNTIME_DIR (the drafters
# converted: 3.5 GB of disk, little RAM), then `dspark smoke` in bfloat16 and float32, one
# process each, under the flock BIGMEM_LOCK (up to 20 GB of RAM); ~10 minutes on 2 cores.
# Writes the runtime section of bench/RESULTS.md and bench/runtime_results.json.
BENCH_RUNTIME_DIR ?= /tmp/dspark-runtime-bench
BIGMEM_LOCK ?= /tmp/dspark-bigmem.lock
bench-runtime: $(STAMP)
	$(BIN)/python bench/runtime.py build --workdir $(BENCH_RUNTIME_DIR)
	flock $(BIGMEM_LOCK) $(BIN)/python bench/runtime.py run --workdir $(BENCH_RUNTIME_DIR)

# Verify-length policies under concurrent load (bench/serving.py): serve-bench on the golden
# models (measured), simulate on the same decisions (replayed against the measurement), and
# a sweep against an all-zero Qwen3-4B's profile in bfloat16 (~9 GB of RAM, ~20 minutes on 2
# cores; BENCH_SERVING_FLAGS=--reuse-4b keeps it) and a GPU-shaped cost model.
# Writes the serving section of bench/RESULTS.md and bench/serving_results.json.
BENCH_SERVING_DIR ?= /tmp/dspark-serving-bench
bench-serving: $(STAMP)
	flock $(BIGMEM_LOCK) $(BIN)/python bench/serving.py --workdir $(BENCH_SERVING_DIR) $(BENCH_SERVING_FLAGS)

# The pre-release gate, exactly as .github/workflows/gate.yml runs it (docs/GATE.md): every
# drafter of release/golden.toml pinned, converted, checked, quantized, run and evaluated;
# gate.json, gate.md, junit.xml and every artifact in build/gate/.
gate: $(STAMP)
	$(BIN)/dspark gate release/golden.toml -o build/gate --force

# The long fuzz run (docs/FUZZING.md): DSPARK_FUZZ_EXAMPLES examples per property
# (default 5000); log in build/fuzz/last-run.log.
fuzz: $(STAMP)
	scripts/fuzz.sh

clean:
	rm -rf build .pytest_cache .hypothesis
