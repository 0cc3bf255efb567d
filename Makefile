# The two quick-start commands: `make demo` and `make test` (README.md, "Quick start"); `make unit` is the
# fast loop while working on the code, `make system-deps` what CI installs first (.ci/run).
# The sandboxed test runs exec this venv's interpreter as an unprivileged uid, so the venv
# is built from an interpreter every user can reach (Debian's, not one under /root).
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test

.PHONY: demo test unit coverage lint bench clean bytecode system-deps bubblewrap postgresql guest-deps nodejs ts-client upstream-servers chromium curl

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

# The system packages the suite uses, installed as root (once; nothing when they are there).
# `make test` depends on it, so that on a fresh machine as root it still runs everything; without
# root nothing is installed and the tests that need them skip (the guest's tests fail, naming
# `make guest-deps`).
system-deps: bubblewrap postgresql guest-deps nodejs chromium curl

# The bubblewrap backend (sandbox.backend: bubblewrap) and its tests need Debian's bubblewrap.
bubblewrap:
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null; }; }

# A proxied run's tests fetch through the proxy with curl as well as Python (tests/sandbox/test_proxy_listener.py).
curl:
	@command -v curl >/dev/null || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends curl >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends curl >/dev/null; }; }

# The PostgreSQL tests start a throwaway cluster of Debian's postgresql (tests/pg_cluster.py).
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends postgresql >/dev/null; }; }

# The web console's tests (tests/e2e/test_console.py) drive Debian's chromium with Playwright
# (the `test` extra), launched by path: `playwright install` is never run.
chromium:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }; }

# The host matrix's guest (tests/guest.py): QEMU without its recommends (no GUI, no firmware
# blobs but the SeaBIOS it boots with), Debian's distribution kernel (6.1: another kernel, another
# Landlock ABI) and busybox-static for the guest's own initramfs (INITRD=No: Debian's is not
# used, and building it costs most of the install). Quick when they are installed.
GUEST_PACKAGES := qemu-system-x86 linux-image-amd64 busybox-static
guest-deps:
	@dpkg -s $(GUEST_PACKAGES) >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive INITRD=No; \
	  apt-get install -y -q --no-install-recommends $(GUEST_PACKAGES) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(GUEST_PACKAGES) >/dev/null; }; }

# The suite drives a client nobody here wrote, the official TypeScript SDK
# (tests/e2e/test_typescript_client.py): Debian's Node.js and npm when the machine has none.
nodejs:
	@command -v npm >/dev/null || [ "$$(id -u)" != 0 ] || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends nodejs npm >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends nodejs npm >/dev/null; }; }

# examples/typescript/client.ts: the SDK at the version package-lock.json pins, compiled with tsc.
# Without npm (not root, no Node.js) nothing is built and that test skips.
TS_CLIENT := examples/typescript
$(TS_CLIENT)/dist/client.js: $(TS_CLIENT)/client.ts $(TS_CLIENT)/package-lock.json $(TS_CLIENT)/tsconfig.json
	@command -v npm >/dev/null || { echo "npm not found: the TypeScript client test will skip"; exit 0; }; \
	  cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build

ts-client: $(TS_CLIENT)/dist/client.js

# The npm MCP servers the suite puts behind the gateway (tests/e2e/test_upstream_filesystem.py,
# test_upstream_everything.py; docs/upstreams/): @modelcontextprotocol/server-filesystem and
# server-everything at the exact versions package.json names, the bytes package-lock.json pins (npm ci).
# Without npm (not root, no Node.js) nothing is installed and those tests skip.
UPSTREAM_NPM := examples/upstream-servers
$(UPSTREAM_NPM)/node_modules/.package-lock.json: $(UPSTREAM_NPM)/package.json $(UPSTREAM_NPM)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: the npm upstream servers' tests will skip"; exit 0; }; \
	  cd $(UPSTREAM_NPM) && npm ci --no-audit --no-fund --loglevel=error

upstream-servers: $(UPSTREAM_NPM)/node_modules/.package-lock.json


# The suite in parallel, in workers forked after one collection (tests/forked_workers.py, decision 105): most
# tests wait on subprocesses, sessions and sandboxed runs, so there are more workers than cores; the tests that
# share a resource go whole to one worker (tests/conftest.py, SERIAL_GROUPS). TEST_WORKERS=0 runs it in this one
# process. 2026-11-28 13:17 UTC, load 0.3 at the start, nothing else running: 5,385 passed in 7:13 (the make
# target 7:15, user+sys 665 s), where 6 pytest-xdist workers took 7:22 the day before. The gateways and commands
# the tests start fork from a helper with the gateway imported (tests/forked_gateway.py, decision 76).
TEST_WORKERS ?= 4
test: lint system-deps ts-client upstream-servers bytecode
	$(TEST_ENV) $(PY) -m pytest -p no:xdist --forks $(TEST_WORKERS)

# The suite starts several hundred gateways from this checkout, some as other uids that cannot
# write here. Some hosts set PYTHONDONTWRITEBYTECODE (Python's Docker images do): then each of
# those processes compiled the gateway again (about 100 ms of CPU each) and every pytest worker
# rewrote every test module. So the gateway's bytecode is written once up front, and the suite
# runs with bytecode caches on, as an installed package has them.
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE
bytecode: $(STAMP)
	$(PY) -m compileall -q gateway sandbox >/dev/null

# The unit tests of the gateway and the sandbox (the aim: under a minute on 2 quiet cores): no stdio sessions
# (tests/e2e), no hostile suites (tests/adversarial). Run `make test` before you push. One pytest process
# collects them, then forks UNIT_WORKERS workers that share what it collected and start at once
# (tests/forked_workers.py); more workers than cores, since many tests wait on a watchdog, a sweep or a timeout.
# Where the time goes: `$(PY) -m pytest -p no:xdist --forks 5 tests/gateway tests/sandbox --cpu-costs=30`
# (tests/cpu_costs.py). What was measured and rejected: decisions 103, 105, 107, 109 and 110, and git log.
# 2026-11-28 16:51-17:00, nothing else running, interleaved with the tree before these changes (7f564e1 in a venv
# of its own, the same machine in the same quarter hour): `make unit` 51.2, 51.0 and 51.5 s against 68.2, 64.2
# and 65.9 s; user+sys 71-76 s against 95-104 s. The tests' own CPU 58.8 s where it was 84 s (--cpu-costs).
UNIT_WORKERS ?= 5
unit: $(STAMP) bytecode
	$(TEST_ENV) $(PY) -m pytest -p no:xdist --forks $(UNIT_WORKERS) tests/gateway tests/sandbox

# Line coverage of gateway/ and sandbox/ over the whole suite (pyproject.toml, [tool.coverage.*]):
# every Python process the tests start is measured too. The data goes to a folder every uid may
# write to (sticky, as /tmp), since the rootless tests run gateways as ordinary uids.
COVERAGE_DATA := build/coverage
coverage: $(STAMP) system-deps ts-client upstream-servers bytecode
	rm -rf $(COVERAGE_DATA) && mkdir -p $(COVERAGE_DATA) && chmod 1777 $(COVERAGE_DATA)
	export COVERAGE_FILE=$(CURDIR)/$(COVERAGE_DATA)/data; \
	  $(TEST_ENV) $(PY) -m coverage run -m pytest -p no:xdist --forks $(TEST_WORKERS); status=$$?; \
	  $(PY) -m coverage combine -q && \
	  for part in gateway sandbox; do printf '%s/: %s%%\n' $$part "$$($(PY) -m coverage report --include="$$part/*" --format=total)"; done && \
	  printf 'both: %s%%\n' "$$($(PY) -m coverage report --format=total)" && \
	  echo "per file: COVERAGE_FILE=$(COVERAGE_DATA)/data $(PY) -m coverage report (or html)"; \
	  exit $$status

bench: $(VENV)/.installed
	$(PY) bench/stdio_refusals.py

clean:
	rm -rf $(VENV) .demo build *.egg-info $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist $(UPSTREAM_NPM)/node_modules
