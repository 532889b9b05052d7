# Each target sets up what it needs; see README.md.
.PHONY: run stop test lint bench venv requirements

run:        ## MongoDB + emulator + service, then a sample batch processed end to end
	bash infra/run-local.sh

stop:       ## stop everything `make run` started
	bash infra/stop-local.sh

test:       ## install, lint, type-check and run every test against real servers
	bash infra/test.sh

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
