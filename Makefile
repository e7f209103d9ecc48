# The course's commands. Every target sets up .venv itself (created if missing, reinstalled
# when requirements.txt or pyproject.toml changed), so a fresh clone needs only Python 3.11.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the site's pinned npm tools, installed by `npm ci` (see node-deps below)
SITE_NODE := site/node_modules/.installed
PORT ?= 8888
DEPTH ?= developer
# Most of the suite waits (on timeouts the tests provoke, kernels, slow writes), so three
# workers finish it in well under half the time while the two cores stay busy. Which tests
# share a worker is decided in tests/conftest.py (one worker per module with a shared fixture).
PYTEST_ARGS ?= -n 3 --durations=15
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help setup lab test course release bench check grade browser-deps sandbox-deps db-deps learner-bundle site node-deps hub hub-deps hub-stop clean

help:
	@echo "make lab        set up .venv and open JupyterLab at the start notebook"
	@echo "make test       set up .venv and run the whole test suite"
	@echo "make course     execute every notebook with papermill into build/ (QUICK=1 for CI sizes, ONLY=text to pick)"
	@echo "make release    regenerate notebooks/ from solutions/ with nbgrader"
	@echo "make check      grade your own copy: make check DEPTH=developer"
	@echo "make grade      grade the class's collected submissions in parallel: make grade ASSIGNMENT=developer [WORKERS=N] [SCHEDULER=tcp://host:port] [FORCE=1]"
	@echo "make learner-bundle  the learners' copy of the course (no solutions/) in build/learner"
	@echo "make bench      benchmarks (pool start-up, grading time, lint time)"
	@echo "make site       the course as a website in build/site (notebooks executed, cached in build/site-cache)"
	@echo "make hub        the course on a JupyterHub at 127.0.0.1 (as root; USERS=1 creates its Unix users, HUB_PORT=N, HUB_PYTHON=python3.11)"
	@echo "make hub-stop   stop that hub and every server it started"

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Python 3.11 is needed, found " + sys.version.split()[0] + ": run make PYTHON=/path/to/python3.11")'
	@if [ ! -x $(BIN)/python ] || ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then \
		rm -rf $(VENV); $(PYTHON) -m venv $(VENV); fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	for ext in formgrader assignment_list course_list validate_assignment; do \
		$(BIN)/jupyter server extension enable --sys-prefix nbgrader.server_extensions.$$ext >/dev/null 2>&1 || exit 1; done
	$(BIN)/jupyter server extension enable --sys-prefix nbgitpuller >/dev/null 2>&1
	$(BIN)/jupyter labextension enable --level=sys_prefix @jupyter/nbgrader >/dev/null
	$(BIN)/jupyter labextension enable --level=sys_prefix @jupyter-widgets/jupyterlab-manager >/dev/null
	@touch $(STAMP)

setup: $(STAMP)

# make lab's local nbgrader exchange (course_tools/lab.py): released again when a notebook changes.
LAB_CONFIG := build/lab-config
$(LAB_CONFIG)/nbgrader_config.py: $(STAMP) $(wildcard notebooks/*/*)
	$(BIN)/python -m course_tools.lab >/dev/null

lab: $(STAMP) $(LAB_CONFIG)/nbgrader_config.py
	JUPYTER_CONFIG_PATH=$(abspath $(LAB_CONFIG))$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH} \
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --port=$(PORT) --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/notebooks/start/00_start_here.ipynb \
		$(if $(filter 0,$(shell id -u)),--allow-root,)

browser-deps: $(STAMP)
	@$(BIN)/python -m course_tools.browser >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
		else $(BIN)/python -m course_tools.browser; exit 1; fi; }

# bubblewrap sandboxes each submission's grading kernel (course_tools/sandbox.py)
sandbox-deps: $(STAMP)
	@$(BIN)/python -m course_tools.sandbox >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
		fi; $(BIN)/python -m course_tools.sandbox; }

# PostgreSQL for the tests of a shared gradebook (tests/pg.py starts a throw-away server)
db-deps:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; \
		else echo "the gradebook tests need PostgreSQL's initdb: sudo apt-get install postgresql"; exit 1; fi; }

test: $(STAMP) browser-deps sandbox-deps db-deps $(SITE_NODE) hub-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

course: $(STAMP)
	$(BIN)/python -m course_tools.run_notebooks $(if $(QUICK),--quick,) $(if $(ONLY),--only $(ONLY),)

release: $(STAMP)
	$(BIN)/python -m course_tools.release

learner-bundle: $(STAMP)
	$(BIN)/python -m course_tools.learner_bundle $(DEST)

check: $(STAMP)
	$(BIN)/python -m course_tools.selfcheck $(DEPTH)

ASSIGNMENT ?= developer
grade: $(STAMP) sandbox-deps
	$(BIN)/python -m course_tools.grade $(ASSIGNMENT) $(if $(WORKERS),--workers $(WORKERS),) \
		$(if $(SCHEDULER),--scheduler $(SCHEDULER),) $(if $(FORCE),--force,)

# The site's pinned npm tools (mystmd, myst-to-html, axe-core): site/package-lock.json, installed with npm ci.
node-deps:
	@command -v npm >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; \
		else echo "make site needs Node.js 18 or newer and npm (sudo apt-get install nodejs npm)"; exit 1; fi; }

$(SITE_NODE): site/package.json site/package-lock.json | node-deps
	npm ci --prefix site --no-audit --no-fund --loglevel=error
	@touch $@

site: $(STAMP) $(SITE_NODE)
	$(BIN)/python -m course_tools.site

# The course on a JupyterHub (hub/): its shared environment is built from a Python 3.11 every
# user can run (HUB_PYTHON: Debian's /usr/bin/python3.11 by default, installed with apt-get when
# missing; CI passes actions/setup-python's), its proxy is hub/package-lock.json's.
HUB_ROOT ?= /opt/one-rank-hub
HUB_PYTHON ?= $(or $(COURSE_HUB_PYTHON),/usr/bin/python3.11)
export COURSE_HUB_PYTHON := $(HUB_PYTHON)
HUB_ARGS = --root $(HUB_ROOT) --env $(HUB_ROOT)/venv
hub-deps: $(STAMP) | node-deps
	@if [ "$$(id -u)" != 0 ]; then echo "make hub-deps: skipped, $$($(BIN)/python -c 'from hub.course_hub import NOT_ROOT; print(NOT_ROOT)')"; exit 0; fi; \
	if ! "$(HUB_PYTHON)" -c 'import ensurepip' 2>/dev/null; then \
		if [ "$(HUB_PYTHON)" = /usr/bin/python3.11 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && apt-get install -y -qq python3.11 python3.11-venv >/dev/null; \
		else echo "make hub-deps: $(HUB_PYTHON) is not a Python 3.11 with venv: give one every user can run, make hub HUB_PYTHON=/path/to/python3.11"; exit 1; fi; fi; \
	$(BIN)/python -m hub $(HUB_ARGS) env && $(BIN)/python -c 'from hub.course_hub import proxy_command; proxy_command()'

hub: hub-deps
	$(BIN)/python -m hub $(HUB_ARGS) serve $(if $(USERS),--users,) $(if $(HUB_PORT),--port $(HUB_PORT),)

hub-stop: $(STAMP)
	$(BIN)/python -m hub $(HUB_ARGS) stop

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf build .pytest_cache
