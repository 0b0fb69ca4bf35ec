"""Container health checks for docker-compose.yml; exit 0 when healthy, 1 otherwise.

    python docker/healthcheck.py celery NAME   # the Celery worker NAME@<this host> answers a ping
    python docker/healthcheck.py http URL      # URL answers 200 (the web app's /healthz)
    python docker/healthcheck.py tcp HOST PORT # something listens (flower)

A worker with `--pool solo` (planner, evaluator) cannot answer while it runs a task, so the compose
file allows it as many failed checks in a row as cover the longest task (the hard time limit).
"""

from __future__ import annotations

import socket
import sys
import urllib.request

TIMEOUT_S = 5.0


def celery_answers(name: str) -> bool:
    from shared.celery_app import make_celery
    from shared.settings import Settings

    app = make_celery(Settings.from_env(), "healthcheck")
    try:
        replies = app.control.ping(destination=[f"{name}@{socket.gethostname()}"], timeout=TIMEOUT_S)
    finally:
        app.close()
    return bool(replies)


def http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.status == 200
    except OSError:
        return False


def tcp_answers(host: str, port: str) -> bool:
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S):
            return True
    except OSError:
        return False


CHECKS = {"celery": celery_answers, "http": http_answers, "tcp": tcp_answers}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CHECKS:
        print(__doc__, file=sys.stderr)
        return 2
    healthy = CHECKS[argv[0]](*argv[1:])
    if not healthy:
        print(f"unhealthy: {' '.join(argv)}", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
