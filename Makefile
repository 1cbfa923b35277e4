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

.PHONY: all test test-slow demo bench bench-optim bench-summary bench-rnn bench-distributed build lint readme clean

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

$(EXT_STAMP): $(DEPS_STAMP) $(NATIVE_SRC)
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $@

build: $(DEPS_STAMP)
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $(EXT_STAMP)

test: $(EXT_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

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
