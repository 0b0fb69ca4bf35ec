"""Python imports this at start-up in every process whose PYTHONPATH holds this folder; tests/conftest.py
puts it there in the PostgreSQL pass and while recording which tests use a database. In a process the
tests started (a Celery worker, the `kernelswarm` command), tests/deploy/childhook.py then does what the
test process does: SQLite file URLs go to the same PostgreSQL databases, database use is recorded.
Without those variables (the evaluator's sandboxed children, any other run) it does nothing."""

import os

if os.environ.get("KS_TEST_POSTGRES_URL") or os.environ.get("KS_TEST_DB_LOG"):
    import sys

    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import childhook

    childhook.install()
