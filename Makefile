# peloton developer commands. `make demo` and `make test` each set up everything they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
PROTOS := $(wildcard proto/peloton/v1/*.proto)
STAMP  := $(VENV)/.installed

.PHONY: help dev proto proto-check bundle images lint test test-mesos bench demo demo-sim clean prometheus chromium

help:
	@echo "make dev          virtualenv in $(VENV), editable install with dev tools, generated code"
	@echo "make test         the whole test suite (SQLite and PostgreSQL; starts local PostgreSQL, installs"
	@echo "                  prometheus and chromium)"
	@echo "make test-mesos   end to end on real Mesos (PELOTON_TEST_MESOS_MASTER, else local real clusters)"
	@echo "make lint         ruff, mypy, the import contracts and the generated-code check"
	@echo "make bench        benchmarks (figures go in BENCHMARKS.md)"
	@echo "make demo         a local cluster (2 agents x 2 GPUs) and a daemon on SQLite in .demo/: a pool"
	@echo "                  tree, a 4-worker gang training with allreduce, its states, placement and loss"
	@echo "make demo-sim     a small simulation (peloton simulate): 500 jobs on 64 GPUs under each queue"
	@echo "                  policy, its summary table, and the plots' paths in .demo/sim/"
	@echo "make proto        regenerate peloton/v1 from proto/"
	@echo "make proto-check  fail if the committed generated code in peloton/v1 is stale"
	@echo "make bundle       the collective runtime bundle for task containers in build/peloton-runtime"
	@echo "                  (mounted at /opt/peloton) and its image build/peloton-runtime.tar"
	@echo "make images       build/images: a registry for the minicluster's task containers (README"
	@echo "                  \"Task containers\"): the runtime bundle's image and example:1"
	@echo "make prometheus   install prometheus and promtool (Debian package, as root)"
	@echo "make chromium     install chromium and chromedriver for the console's browser tests (Debian, as root)"
	@echo "make clean        remove $(VENV), .demo, .bench and tool caches"

$(STAMP): pyproject.toml scripts/install-http-parser.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# pymesos needs http-parser, whose 0.9.0 sdist cannot build its C extension on Python 3.11+.
	scripts/install-http-parser.sh $(BIN)/pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

dev: $(STAMP) proto bundle

# Generated code is committed (installs need no protoc); `make proto-check` keeps it current.
proto: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(PY) -m grpc_tools.protoc -Iproto \
		--python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $(PROTOS)

proto-check: $(STAMP)
	@tmp=$$(mktemp -d) && \
	PATH=$(CURDIR)/$(BIN):$$PATH $(PY) -m grpc_tools.protoc -Iproto \
		--python_out=$$tmp --grpc_python_out=$$tmp --mypy_out=$$tmp --mypy_grpc_out=$$tmp \
		$(PROTOS) >/dev/null && \
	for f in $$tmp/peloton/v1/*; do \
		cmp -s $$f peloton/v1/$$(basename $$f) || { echo "peloton/v1/$$(basename $$f) is stale: run make proto"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "generated code is current"

# The C++ build is incremental (unchanged sources are not recompiled), so this is cheap when current.
bundle: $(STAMP)
	$(PY) setup.py -q build_bundle
	$(PY) -m peloton.collective.bundle

# A --docker-registry directory for trying task containers on the minicluster: the runtime
# bundle's image, and example:1, an image of this machine's shell and a few coreutils (no Python).
EXAMPLE_IMAGE_PROGRAMS := sh cat df echo env ls sleep tail
images: bundle
	$(PY) -m peloton.collective.bundle --registry build/images
	$(PY) -m peloton.minicluster.hostrootfs --registry build/images example:1 $(EXAMPLE_IMAGE_PROGRAMS)

lint: $(STAMP) proto-check
	$(BIN)/ruff check peloton tests bench migrations
	$(BIN)/ruff format --check peloton tests bench migrations
	$(BIN)/mypy peloton bench
	$(BIN)/lint-imports

# prometheus and promtool, which the deploy and Prometheus tests run (Debian package, as root).
prometheus:
	scripts/install-prometheus.sh

# chromium and chromedriver, which the web console's browser tests drive (Debian packages, as root).
chromium:
	scripts/install-chromium.sh

test: $(STAMP) prometheus chromium
	scripts/ensure-postgres.sh
	$(BIN)/pytest -q --ignore=tests/mesos -n 2 --dist loadfile

# Against PELOTON_TEST_MESOS_MASTER (host:port), else local real Mesos 1.11 clusters started from
# ../shared/real-mesos (PELOTON_REAL_MESOS_DIR); PYTEST_ARGS, e.g. -m 'not disruptive', go to
# pytest. See "Running on Mesos" in README.md.
test-mesos: $(STAMP)
	scripts/ensure-postgres.sh
	$(BIN)/pytest -q tests/mesos $(PYTEST_ARGS)

bench: $(STAMP) chromium
	scripts/ensure-postgres.sh
	$(PY) -m bench.bench_jobs
	$(PY) -m bench.bench_security
	$(PY) -m bench.bench_watches
	$(PY) -m bench.bench_resmgr
	$(PY) -m bench.bench_hostmgr
	$(PY) -m bench.bench_placement
	$(PY) -m bench.bench_allreduce
	$(PY) -m bench.bench_containers
	$(PY) -m bench.bench_elastic
	$(PY) -m bench.bench_sweep
	$(PY) -m bench.bench_sim
	# End to end is minutes per full run (see BENCHMARKS.md); here a small run that must pass.
	$(PY) -m bench.bench_e2e --check
	$(PY) -m bench.bench_ha --repeats 1 --rounds 3
	$(PY) -m bench.bench_console --repeats 3

demo: $(STAMP)
	$(PY) -m peloton.demo

demo-sim: $(STAMP)
	mkdir -p .demo/sim
	$(BIN)/peloton simulate generate --jobs 500 --gpus 64 --load 0.9 --seed 1 -o .demo/sim/trace.csv
	$(BIN)/peloton simulate run --trace .demo/sim/trace.csv --hosts 8 --gpus-per-host 8 --racks 2 \
	    --policy priority_fifo --policy backfill --policy las --policy baseline-backfill \
	    --json .demo/sim/sim.json --plots .demo/sim/plots
	@ls .demo/sim/plots/*.png

clean:
	rm -rf $(VENV) .demo .bench .pytest_cache .mypy_cache .ruff_cache .hypothesis peloton.egg-info
