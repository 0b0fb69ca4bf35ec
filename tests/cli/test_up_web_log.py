"""Under `kernelswarm up` the web's log (a line per request) goes to `.kernelswarm/logs/web.log`
only: the console is for progress."""

from __future__ import annotations

import http.client
import logging
import subprocess
import sys
import threading
import time

import pytest

from kernelswarm.cli import main
from kernelswarm.launcher import REDIS, Services
from tests.cli.upsetup import prepare_up

REQUESTS = 3


class WaitingServices(Services):
    """Services whose Celery workers are Python programs that wait: nothing but the web answers."""

    def _start(self, name: str) -> None:
        if name == REDIS:
            super()._start(name)
            return
        self.processes[name] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def ask_healthz(port: int, answered: list[int]) -> None:
    """GET /healthz REQUESTS times, once the web answers (within 30 s)."""
    deadline = time.monotonic() + 30
    while len(answered) < REQUESTS and time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/healthz")
            answered.append(connection.getresponse().status)
            connection.close()
        except OSError:
            time.sleep(0.1)


@pytest.mark.database_agnostic("up's queries, run on PostgreSQL by tests/cli/test_up_campaign.py and "
                               "tests/cli/test_up_drain.py")
def test_the_webs_requests_go_to_its_log_file_not_to_the_console(tmp_path, monkeypatch, capsys):
    port = prepare_up(tmp_path, monkeypatch, WaitingServices)
    console = Records()  # what reaches the root logger's handlers, the console's among them
    logging.getLogger().addHandler(console)

    answered: list[int] = []
    asking = threading.Thread(target=ask_healthz, args=(port, answered))
    asking.start()
    assert main(["up", "--duration", "6"]) == 0
    asking.join(timeout=30)

    assert answered == [200] * REQUESTS
    lines = (tmp_path / "home" / "logs" / "web.log").read_text().splitlines()
    assert sum('"GET /healthz HTTP/1.1" 200' in line for line in lines) == REQUESTS
    assert not [r for r in console.records if r.name == "werkzeug"]
    assert "/healthz" not in capsys.readouterr().err
    assert logging.getLogger("werkzeug").propagate  # given back when the web stopped
