"""`kernelswarm up` restarts a service that exits, as compose's `restart: unless-stopped` does, and
gives up on one that keeps exiting."""

from __future__ import annotations

import subprocess
import sys

from kernelswarm import launcher
from kernelswarm.launcher import MAX_RESTARTS, Services
from shared.settings import Settings


class QuickServices(Services):
    """Services whose processes are tiny Python programs: `exits` ones end at once, others wait."""

    exits: set[str] = set()

    def _start(self, name: str) -> None:
        code = "import sys; sys.exit(3)" if name in self.exits else "import time; time.sleep(60)"
        self.processes[name] = subprocess.Popen([sys.executable, "-c", code])


def test_a_dead_service_is_started_again_and_a_crash_loop_is_given_up(tmp_path, monkeypatch):
    services = QuickServices(Settings(home=tmp_path), tmp_path / "logs")
    services.exits = {"worker"}
    try:
        services.start()
        services.processes["worker"].wait()
        assert services.restart_dead() == (["worker"], [])
        first = services.processes["worker"]
        assert first.wait() == 3
        for _ in range(MAX_RESTARTS - 1):
            services.processes["worker"].wait()
            assert services.restart_dead() == (["worker"], [])
        services.processes["worker"].wait()
        assert services.restart_dead() == ([], ["worker"])  # five restarts within the window: a crash loop
        monkeypatch.setattr(launcher.time, "monotonic", lambda: 1e12)  # much later: restarts allowed again
        assert services.restart_dead() == (["worker"], [])
        assert services.processes["planner"].poll() is None and services.restarts.get("planner") is None
    finally:
        services.stop()
