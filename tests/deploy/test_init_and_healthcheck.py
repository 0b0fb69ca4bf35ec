"""The compose cluster's own scripts, run as the containers run them: docker/init.py against a real
PostgreSQL server and an S3-compatible server (moto), docker/healthcheck.py against a live web
endpoint, a listening port and a real Celery worker on a real redis-server."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from minio import Minio
from sqlalchemy import create_engine, inspect, text

from kernelswarm.launcher import RedisServer
from pgtest import PostgresServer, create_database, free_port
from shared.db import Base
from shared.db.session import alembic_config

REPO = Path(__file__).resolve().parents[2]
INIT = REPO / "docker" / "init.py"
HEALTHCHECK = REPO / "docker" / "healthcheck.py"
STARTUP_TIMEOUT_S = 60.0
KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def clean_env(**settings: str) -> dict[str, str]:
    """What a container has: no KERNELSWARM_ setting but the ones given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELSWARM_")}
    return env | settings


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """`host:port` of moto's S3 server, in a process of its own."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              env=os.environ | KEYS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not listening("127.0.0.1", port):
            assert server.poll() is None, f"moto exited with {server.returncode}"
            assert time.monotonic() < deadline, "moto did not listen in time"
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def run(script: Path, *args: str, env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


# docker/init.py


def test_init_migrates_the_database_and_makes_the_bucket_once(postgres, s3, tmp_path):
    create_database(postgres.base_url, "init")
    env = clean_env(KERNELSWARM_DATABASE_URL=postgres.url("init"), KERNELSWARM_STORE_URL="s3://cluster-objects",
                    KERNELSWARM_MINIO_ENDPOINT=s3, KERNELSWARM_MINIO_ACCESS_KEY="test",
                    KERNELSWARM_MINIO_SECRET_KEY="test", KERNELSWARM_HOME=str(tmp_path))

    first, again = run(INIT, env=env), run(INIT, env=env)

    assert first.returncode == 0, first.stderr
    assert again.returncode == 0, again.stderr  # a restarted cluster runs it again: nothing to do
    head = ScriptDirectory.from_config(alembic_config(postgres.url("init"))).get_current_head()
    assert f"database at migration {head}" in first.stderr
    engine = create_engine(postgres.url("init"))
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
        assert set(inspect(engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
    finally:
        engine.dispose()
    assert Minio(s3, access_key="test", secret_key="test", secure=False).bucket_exists("cluster-objects")


def test_init_fails_when_the_database_never_answers(tmp_path, monkeypatch):
    """A failed init stops the cluster's start (its dependents wait for success)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compose_init", INIT)
    init = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(init)
    monkeypatch.setattr(init, "WAIT_S", 0.5)
    monkeypatch.setattr(init, "RETRY_EVERY_S", 0.1)
    for key in [k for k in os.environ if k.startswith("KERNELSWARM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("KERNELSWARM_DATABASE_URL", f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    monkeypatch.setenv("KERNELSWARM_HOME", str(tmp_path))

    with pytest.raises(Exception, match="Connection refused|connection failed"):
        init.main()


# docker/healthcheck.py


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def web() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_http_check(web):
    assert run(HEALTHCHECK, "http", f"{web}/healthz", env=clean_env()).returncode == 0
    assert run(HEALTHCHECK, "http", f"{web}/broken", env=clean_env()).returncode == 1
    assert run(HEALTHCHECK, "http", f"http://127.0.0.1:{free_port()}/healthz", env=clean_env()).returncode == 1


def test_tcp_check(web):
    port = web.rsplit(":", 1)[1]
    assert run(HEALTHCHECK, "tcp", "127.0.0.1", port, env=clean_env()).returncode == 0
    assert run(HEALTHCHECK, "tcp", "127.0.0.1", str(free_port()), env=clean_env()).returncode == 1


def test_unknown_check_is_a_usage_error():
    assert run(HEALTHCHECK, "nope", env=clean_env()).returncode == 2


def test_celery_check_pings_the_named_worker_on_this_host(tmp_path):
    redis_server = RedisServer(tmp_path / "redis")
    env = clean_env(KERNELSWARM_REDIS_URL=redis_server.url, KERNELSWARM_HOME=str(tmp_path / "home"))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "services.worker.entrypoint", "worker", "-Q", "write", "--pool",
         "threads", "--concurrency", "1", "-n", "writer@%h", "--without-gossip", "--without-mingle"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while (checked := run(HEALTHCHECK, "celery", "writer", env=env)).returncode != 0:
            assert worker.poll() is None, f"the worker exited with {worker.returncode}"
            assert time.monotonic() < deadline, checked.stderr
        assert run(HEALTHCHECK, "celery", "planner", env=env).returncode == 1  # nobody of that name here
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        redis_server.stop()
