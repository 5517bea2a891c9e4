# The two commands of the README:
#   make run    start the web server and a real Celery worker on the embedded default
#   make test   install what is needed, lint, type-check and run the whole test suite
#   make test-fast  the inner loop: no browser, no real processes, database kept, in parallel
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Byte-code caches on, whatever the environment says: pytest keeps its assertion-rewritten
# modules there, and rewriting them all again cost each test process about 10 s.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install chromium pgbouncer run test test-fast lint bench bench-downstream bench-pages drills drills-full clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

# $(call debian_package,PROGRAM,PACKAGE,WHAT FOR): when PROGRAM is not there, install Debian's
# PACKAGE as root with apt-get; otherwise say how, and what needs it fails.
define debian_package
	@if [ ! -x $(1) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's $(2) for $(3)"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2); \
	  else \
	    echo "note: for $(3), install Debian's $(2): sudo apt-get install $(2)"; \
	  fi; \
	fi
endef

# The browser tests drive Debian's Chromium (Playwright never downloads one here).
chromium:
	$(call debian_package,/usr/bin/chromium,chromium,the browser tests)

run: install
	DEBUG=1 $(PY) manage.py migrate --noinput
	DEBUG=1 $(PY) manage.py shell -c "from django.contrib.auth import get_user_model as m; \
	  U = m(); U.objects.filter(username='admin').exists() or U.objects.create_superuser('admin', password='admin')"
	DEBUG=1 $(PY) manage.py seed_demo
	@echo
	@echo "  API docs:  http://127.0.0.1:8000/api/docs/"
	@echo "  Admin:     http://127.0.0.1:8000/admin/   (admin / admin: a development account)"
	@echo "  Stop with Ctrl-C."
	@echo
	DEBUG=1 honcho -f Procfile.dev start

lint: install
	ruff check .
	ruff format --check .
	mypy .
	lint-imports

test: lint chromium
	pytest

# Not a gate: `make test` is. Skips the browser tests, the tests that start real processes and
# the slow ones; keeps the test database between runs (--reuse-db: add --create-db after a
# new migration) and spreads the tests over FAST_WORKERS processes.
FAST_WORKERS ?= 4
test-fast: install
	TEST_FAST=1 pytest -q -p no:cacheprovider -m "not processes and not slow" --ignore=tests/browser --reuse-db -n $(FAST_WORKERS)

# The leave cache's suite, the pipeline's, then erasure's; all run even when one misses a
# budget, and the target fails when any does.
bench: install
	$(PY) bench/run.py; status=$$?; $(PY) bench/pipeline.py || status=1; $(PY) bench/downstream.py || status=1; $(PY) bench/erasure.py || status=1; $(PY) bench/verify.py || status=1; exit $$status

# The change feed, the CSV export of a million rows and webhook latency (BENCHMARKS.md, "Downstream").
bench-downstream: install
	$(PY) bench/downstream.py

# The operator pages and read endpoints on 10M signals, 1M records, 5M history rows.
bench-pages: install
	$(PY) bench/pages.py

# Reliability drills against a real deployment on this machine (needs PostgreSQL and Redis
# that the drills may restart): the short versions, and the full ones that write RELIABILITY.md.
# The pooled stop-forward drill runs Debian's PgBouncer.
pgbouncer:
	$(call debian_package,/usr/sbin/pgbouncer,pgbouncer,the pooled drill)

drills: install pgbouncer
	$(PY) -m drills.run

drills-full: install pgbouncer
	$(PY) -m drills.run --full

clean:
	rm -rf $(VENV) var db.sqlite3 db_test.sqlite3 .pytest_cache .mypy_cache .ruff_cache .hypothesis
