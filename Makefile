# Each target sets up what it needs; see README.md.
.PHONY: run stop test check explore lint bench venv requirements

run:        ## MongoDB + emulator + service, then a sample batch processed end to end
	bash infra/run-local.sh

stop:       ## stop everything `make run` started
	bash infra/stop-local.sh

test:       ## install, lint, type-check and run every test against real servers
	$(if $(filter true,$(CI)),PYTHONHASHSEED=0) bash infra/test.sh

# The quick tier, for the edit-test loop: no server is started (tests/tiers.py marks the
# tests that need one `server`), and no test marked `slow` runs (seconds of CPU each: the
# 9 MB payloads of tests/service/test_trust.py and tests/contract/test_salvage_contract.py);
# make test runs both kinds. EVENTBUS_TIER=check also cuts three budgets that make test and
# CI run in full: hypothesis's `check` profile draws a fifth of each test's examples,
# derandomized (tests/hypothesis_profiles.py), the model runs 60 examples, not 300
# (tests/model/test_model.py), the simulation 200 seeds, not 2,000 (tests/sim/test_simulation.py).
# mypy's cache (.mypy_cache) is kept between runs: under a second when src is unchanged.
# Bytecode caches are written (as in infra/test.sh): each xdist worker would rewrite every
# test module's asserts again without them.
# CHECK_WORKERS: one xdist worker more than the cores (three here), not pyproject.toml's
# four, which are for make test's server waits: each worker costs 3-4 s of CPU to start and
# collect, but about 50 s of the quick tier's tests wait (deadlines cutting a trickle, a down
# store's timeouts) and a spare worker runs others meanwhile. On this 2-core machine, loaded
# by other work (2026-12-02), medians of make check: four workers 89 s (67 s of CPU), three
# 79 s (66 s), two 85 s (55 s).
CHECK_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
check:      ## ruff, mypy and every quick test that needs no server: in 90 s, before each commit
	bash infra/venv.sh
	.venv/bin/ruff check .
	.venv/bin/mypy src handlers infra main.py
	env -u PYTHONDONTWRITEBYTECODE EVENTBUS_TIER=check .venv/bin/python -m pytest \
	  -m "not server and not slow" -n $(CHECK_WORKERS) $(CHECK_ARGS)

# Random examples, many more of them (tests/hypothesis_profiles.py), the model's long
# budget too; what it finds is kept in .hypothesis/ and becomes an explicit @example.
explore:    ## every property test at random, 2000 examples each unless it sets its own (minutes to hours)
	bash infra/venv.sh
	env -u PYTHONDONTWRITEBYTECODE HYPOTHESIS_PROFILE=explore .venv/bin/python -m pytest -m hypothesis $(EXPLORE_ARGS)
	env -u PYTHONDONTWRITEBYTECODE EVENTBUS_MODEL_PROFILE=long .venv/bin/python -m pytest tests/model/test_model.py $(EXPLORE_ARGS)

lint:
	bash infra/venv.sh && .venv/bin/ruff check . && .venv/bin/mypy src handlers infra main.py

bench:      ## benchmarks: ratios against baselines measured in the same run
	bash infra/venv.sh && .venv/bin/python infra/localdb/bench/store_ops.py && .venv/bin/python infra/localdb/bench/growth.py && .venv/bin/python bench/handler.py && .venv/bin/python bench/pull.py

venv:
	bash infra/venv.sh

requirements: ## re-pin requirements.txt from pyproject.toml (the [service], [telemetry] and [archive] extras)
	bash infra/venv.sh && .venv/bin/pip install -q pip-tools && \
	.venv/bin/pip-compile -q --extra service --extra telemetry --extra archive --strip-extras --no-emit-index-url \
	  --no-emit-find-links -o requirements.txt pyproject.toml
