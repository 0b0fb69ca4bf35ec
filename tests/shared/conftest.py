"""Services the shared-layer tests run against, started on free loopback ports."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kernelswarm.launcher import stop_process


STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(host: str, port: int) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=1)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()


@pytest.fixture
def unused_port() -> int:
    """A loopback port where nothing listens."""
    return free_port()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """`host:port` of an S3-compatible server (moto) for the MinIO client; stopped at the end."""
    host, port = "127.0.0.1", free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _answers(host, port):
            if server.poll() is not None:
                pytest.fail(f"moto_server exited with code {server.returncode} before answering")
            if time.monotonic() > deadline:
                pytest.fail(f"moto_server did not answer on {host}:{port} within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.05)
        yield f"{host}:{port}"
    finally:
        stop_process(server, 10)
