# The two commands a new user needs (see README.md):
#   make demo   set up, start the local Slurm dev cluster, run the main job
#   make test   set up and run every test (the same command CI runs)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := slurmctld slurmd slurm-client munge slurmdbd mariadb-server prometheus systemd

.PHONY: setup system-deps venv user-access lint test test-unit test-slurm-versions demo clean

setup: system-deps venv user-access

# The dev cluster runs jobs as the test users mt-alice and mt-bob (and the daemon as an
# unprivileged account): they must be able to reach this checkout and the venv's Python.
# Grant search (x, never read) permission on the parent directories that lack it.
user-access: venv
	@if [ "$$(id -u)" = 0 ]; then \
	  for target in "$$(pwd)" "$$(readlink -f $(PY))"; do \
	    d=$$(dirname "$$target"); \
	    while [ "$$d" != / ]; do \
	      if [ "$$(( $$(stat -c '%a' "$$d" | tail -c 2) & 1 ))" = 0 ]; then \
	        echo "chmod o+x $$d (so the test users can reach $$target)"; chmod o+x "$$d"; fi; \
	      d=$$(dirname "$$d"); \
	    done; \
	  done; \
	fi

# Debian packages: Slurm 22.05 + munge for the dev cluster, MariaDB for its accounting
# mode, Prometheus for the metrics integration test, systemd for `systemd-analyze verify`.
system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	    | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (or install: $$missing)" >&2; exit 1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[torch,dev]'
	touch $@

lint: venv
	$(VENV)/bin/ruff check malletrain tests benchmarks examples slurm/dev-cluster slurm/record-golden* slurm/slurm_roots.py
	$(VENV)/bin/mypy malletrain
	for s in slurm/dev-cluster slurm/record-golden* slurm/slurm_roots.py; do $(VENV)/bin/mypy "$$s" || exit 1; done

# Unit tier: pure logic only, no Slurm, a few seconds.
test-unit: venv
	$(VENV)/bin/pytest -q tests/unit

# `make test`: lint and the pure tier (no Slurm, no workers) run niced beside the cluster
# tiers, whose tests mostly wait on Slurm and on paced training steps, so the run takes about
# the cluster tiers' time. The two side logs are printed whole at the end; any failure fails.
PURE_TESTS := tests/unit tests/sim
TEST_LOGS := build/test-logs

test: setup
	@mkdir -p $(TEST_LOGS)
	@nice -n 10 $(MAKE) --no-print-directory lint > $(TEST_LOGS)/lint.log 2>&1 & lint_pid=$$!; \
	nice -n 10 $(VENV)/bin/pytest -q -p no:cacheprovider $(PURE_TESTS) \
	  > $(TEST_LOGS)/pure.log 2>&1 & pure_pid=$$!; \
	$(VENV)/bin/pytest -q $(addprefix --ignore=,$(PURE_TESTS)); cluster_rc=$$?; \
	wait $$lint_pid; lint_rc=$$?; wait $$pure_pid; pure_rc=$$?; \
	echo "=== lint ($(TEST_LOGS)/lint.log)"; cat $(TEST_LOGS)/lint.log; \
	echo "=== pure tier: $(PURE_TESTS) ($(TEST_LOGS)/pure.log)"; cat $(TEST_LOGS)/pure.log; \
	echo "=== lint rc $$lint_rc, pure tier rc $$pure_rc, cluster tiers rc $$cluster_rc"; \
	[ $$lint_rc = 0 ] && [ $$pure_rc = 0 ] && [ $$cluster_rc = 0 ]

# The Slurm contract tests and the daemon's end-to-end tests against the other tested
# releases (22.05 runs in `make test`); a release runs this (about 8 min per release).
# The first run of each makes its Debian root (slurm/slurm_roots.py, minutes).
SLURM_VERSIONS ?= 24.11 26.05
test-slurm-versions: setup
	for v in $(SLURM_VERSIONS); do \
	  MALLETRAIN_TEST_SLURM_VERSION=$$v $(VENV)/bin/pytest -q tests/slurm tests/e2e || exit 1; \
	done

demo: setup
	$(PY) -m malletrain.demo

clean:
	-slurm/dev-cluster down
	rm -rf $(VENV) build *.egg-info
