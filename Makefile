# The two commands a new user needs: `make run` and `make test`. Both set up everything first.
# The venv's Python: the first of PYTHON_CANDIDATES that others may run (as root: `nobody` can start
# it, e.g. Debian's /usr/bin/python3.11 where pyenv's lies under root's 0700 home), so that the
# sandbox can give every untrusted child a uid of its own (isolation.unprivileged_ids); else the
# first that exists. `make setup PYTHON=...` overrides the choice.
PYTHON_CANDIDATES ?= /usr/bin/python3.11 /usr/local/bin/python3.11 python3.11 /usr/bin/python3 python3
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in $(PYTHON_CANDIDATES); do command -v $$p >/dev/null || continue; \
	if [ "$$(id -u)" != 0 ] || setpriv --reuid=65534 --regid=65534 --clear-groups $$p -c '' 2>/dev/null; \
	then echo $$p; exit; fi; done; echo python3)
endif
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages: `apt-get update` only where the package lists are missing or over an hour old,
# so that a clean machine's four installs update them once.
APT_INSTALL = $(SUDO) sh -c 'find /var/lib/apt/lists -maxdepth 1 -name "*_Packages*" -mmin -60 | grep -q . \
	|| apt-get update -qq; apt-get install -y -qq "$$@"' apt-install

.PHONY: setup run test redis chromium postgresql compose local-bases compose-test clean

setup: $(STAMP) redis chromium

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import ensurepip; ensurepip.version()' >/dev/null 2>&1 || $(APT_INSTALL) "$$(basename "$$($(PYTHON) -c 'import os, sys; print(os.path.realpath(sys.executable))')")-venv"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

redis:
	@command -v redis-server >/dev/null || $(APT_INSTALL) redis-server

# Headless Chromium and its driver for the browser tests (tests/web/test_browser.py): Debian's own.
chromium:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || $(APT_INSTALL) chromium chromium-driver

# PostgreSQL for the suite's second pass (tests/conftest.py starts its own server): Debian's own.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || $(APT_INSTALL) postgresql

# docker-compose 1.29 checks docker-compose.yml (tests/deploy) without a Docker engine; without its
# recommends it does not pull in the engine (16 small packages instead of about 290 MB).
compose:
	@command -v docker-compose >/dev/null || $(APT_INSTALL) --no-install-recommends docker-compose

# The CPU cluster under docker compose, end to end (docs/deploy.md, "make compose-test"): installs and
# starts a Docker engine when missing, builds registry-free bases, runs a campaign through the stack,
# crashes one container of each kind, checks nothing was lost.
local-bases:
	$(SUDO) docker/local-bases.sh

compose-test: setup
	$(PY) docker/compose_test.py $(COMPOSE_TEST_ARGS)

run: setup
	$(VENV)/bin/kernelswarm up --device cpu

# The whole suite on SQLite, then on PostgreSQL every test that uses a database (the SQLite pass
# lists them; the others cannot tell the two apart), in two halves side by side: tests/run_suite.sh,
# tests/conftest.py say how. `make test PYTEST_ARGS=-x` passes options on.
test: setup postgresql compose
	PYTEST=$(VENV)/bin/pytest tests/run_suite.sh $(PYTEST_ARGS)

clean:
	rm -rf .kernelswarm
