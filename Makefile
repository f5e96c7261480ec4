# Two commands on a fresh machine: `make demo` (convert, validate and inspect the bundled
# golden drafter) and `make test`. Both create .venv/ and install the package with the
# pinned CPU torch from constraints.txt on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
REFERENCE := golden/reference/vanilla_conf_markov/draft

.PHONY: install demo test schemas docs fixtures check-generated clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf build/demo
	$(BIN)/dspark inspect $(REFERENCE)
	$(BIN)/dspark convert $(REFERENCE) -o build/demo/reference
	$(BIN)/dspark validate build/demo/reference
	$(BIN)/dspark convert golden/synthetic/dflash_plain -o build/demo/dflash_plain
	$(BIN)/dspark validate build/demo/dflash_plain
	@echo "demo: artifacts in build/demo/ (the smoke run arrives with the runtime)"

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Regenerate checked-in outputs (tests fail when they are stale).
schemas: $(STAMP)
	$(BIN)/python -m dspark_convert.schemas
docs: $(STAMP)
	$(BIN)/python -m dspark_convert.docs
fixtures: $(STAMP)
	$(BIN)/python golden/make_fixtures.py

clean:
	rm -rf build .pytest_cache .hypothesis
