# Every target sets up what it needs from nothing: .venv, a pinned CPU torch,
# the C extension (rebuilt when native/ changes) and the extras.
PY ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test,conformance,demo,dev,mpi,models
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-installed
EXT_STAMP := $(VENV)/.ext-built
NATIVE_SRC := $(wildcard native/include/*.h native/src/*.c native/src/*.h native/src/*.inc) \
              ortcpu_torch/_native/build.py setup.py

.PHONY: all test test-sanitize test-slow soak demo bench bench-optim bench-summary bench-rnn bench-distributed build lint readme clean

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(DEPS_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q setuptools wheel "cffi>=1.15" scipy-openblas32
	$(BIN)/pip install -q --no-build-isolation -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	touch $@
	touch $(EXT_STAMP)

# The deps step's editable install already built the extension and touched this stamp;
# make still runs this recipe after remaking a prerequisite, so it rebuilds only when a
# native source is newer than the stamp (a fresh `make test` builds once, not twice).
$(EXT_STAMP): $(DEPS_STAMP) $(NATIVE_SRC)
	@if [ ! -e $@ ] || [ -n "$$(find $(NATIVE_SRC) -newer $@ 2>/dev/null)" ]; then \
	  echo "$(BIN)/pip install -q --no-build-isolation --no-deps -e ."; \
	  $(BIN)/pip install -q --no-build-isolation --no-deps -e . && touch $@; \
	else echo "C extension up to date"; fi

build: $(DEPS_STAMP)
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $(EXT_STAMP)

# The kernel tests run a second time on the build one ISA level below this CPU's best
# (ORTCPU_ISA: an AVX-512 machine also tests the AVX2 code, an AVX2 one the baseline).
KERNEL_TESTS ?= tests --ignore=tests/distributed --ignore=tests/test_soak.py \
                --ignore=tests/graph --ignore=tests/models --ignore=tests/training

test: $(EXT_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	@lower=$$($(BIN)/python -m ortcpu_torch._native --below-best); \
	if [ -n "$$lower" ]; then \
	  echo "== kernel tests again with ORTCPU_ISA=$$lower"; \
	  ORTCPU_ISA=$$lower $(BIN)/python -m pytest $(KERNEL_TESTS) $(PYTEST_ARGS); \
	else echo "== baseline-only CPU: no lower ISA to test"; fi

# ASan + UBSan build of the native library in its own folder, loaded through
# ORTCPU_NATIVE_LIB by the native-facing tests. Python itself is not instrumented, so
# libasan must be preloaded; detect_leaks=0 because CPython and torch keep allocations
# alive until exit (LeakSanitizer would report those, not our code).
SANITIZE_DIR ?= build/sanitize
SANITIZE_TESTS ?= tests --ignore=tests/distributed --ignore=tests/test_soak.py \
                  --ignore=tests/test_wrap.py --ignore=tests/test_summary_writer.py \
                  --ignore=tests/graph --ignore=tests/models --ignore=tests/training
# A report aborts the process (pytest's captured output would be lost): it goes to
# $(SANITIZE_DIR)/report.<pid>, printed when the run fails.
SANITIZE_LOG = $(abspath $(SANITIZE_DIR))/report
SANITIZE_ENV = LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:alloc_dealloc_mismatch=0:log_path=$(SANITIZE_LOG) \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(SANITIZE_LOG) OMP_NUM_THREADS=2

test-sanitize: $(EXT_STAMP)
	mkdir -p $(SANITIZE_DIR)
	rm -f $(SANITIZE_LOG).*
	$(BIN)/python ortcpu_torch/_native/build.py --sanitize $(SANITIZE_DIR) > $(SANITIZE_DIR).path
	$(SANITIZE_ENV) ORTCPU_NATIVE_LIB=$$(cat $(SANITIZE_DIR).path) \
	  $(BIN)/python -m pytest $(SANITIZE_TESTS) -p no:cacheprovider $(PYTEST_ARGS) \
	  || { cat $(SANITIZE_LOG).* 2>/dev/null; exit 1; }

# 2,000 wrapped training steps per example model: memory must stay flat (tests/test_soak.py)
soak: $(EXT_STAMP)
	$(BIN)/python -m pytest tests/test_soak.py --soak -s $(PYTEST_ARGS)

# the long-running tests (DDP with spawned processes)
test-slow: $(EXT_STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

demo: $(EXT_STAMP)
	$(BIN)/python examples/main_job.py

# make bench BENCH_ARGS="--quick gelu"
bench: $(EXT_STAMP)
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

# optimizer steps vs torch's fused optimizers: make bench-optim OPTIM_BENCH_ARGS="--quick"
bench-optim: $(EXT_STAMP)
	$(BIN)/python -m benchmarks.optim $(OPTIM_BENCH_ARGS)

# TensorBoard writer vs torch.utils.tensorboard (benchmarks/results/summary.md)
bench-summary: $(EXT_STAMP)
	$(BIN)/python -m benchmarks.bench_summary $(BENCH_ARGS)

# allreduce_ vs raw mpi4py, DataParallel scaling/overlap (benchmarks/results/distributed.md)
bench-distributed: $(EXT_STAMP)
	$(BIN)/python -m benchmarks.distributed $(BENCH_ARGS)

# LSTM / GRU / Embedding vs torch (benchmarks/results/rnn_tensor.md)
bench-rnn: $(EXT_STAMP)
	$(BIN)/python -m benchmarks.rnn_tensor $(BENCH_ARGS)

readme: $(EXT_STAMP)
	$(BIN)/python tools/update_readme.py

lint: $(DEPS_STAMP)
	$(BIN)/ruff check ortcpu_torch tests examples benchmarks tools

clean:
	rm -rf build *.egg-info ortcpu_torch/_native/_ortcpu*.so
