# The two quick-start commands: `make demo` and `make test` (spec section 1).
# The sandboxed test runs exec this venv's interpreter as an unprivileged uid, so the venv
# is built from an interpreter every user can reach (Debian's, not one under /root).
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test

.PHONY: demo test lint bench clean bubblewrap postgresql

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	touch $@

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(VENV)/bin/mcp-gateway demo

lint: $(STAMP)
	$(VENV)/bin/ruff check gateway sandbox tests bench
	$(VENV)/bin/ruff format --check gateway sandbox tests bench
	$(VENV)/bin/mypy

# The bubblewrap backend (sandbox.backend: bubblewrap) and its tests need Debian's bubblewrap;
# as root (as CI runs), `make test` installs it. Without root the sandbox tests skip anyway.
bubblewrap:
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null; }; }

# The PostgreSQL tests start a throwaway cluster of Debian's postgresql (tests/pg_cluster.py);
# as root (as CI runs), `make test` installs it. Without it those tests skip.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }; }

test: lint bubblewrap postgresql
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) bench/stdio_refusals.py

clean:
	rm -rf $(VENV) .demo build *.egg-info
