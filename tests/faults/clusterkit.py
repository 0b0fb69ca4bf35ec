"""Helpers for the fault tests: a small problem the tuner never runs out of, Celery workers as
processes that can be killed outright and started again, and the campaign's counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from shared.db import AssignmentRow, CampaignRow, Database

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


SEED = "def run(x, y):\n    y.copy_(x * 2)\n"


def write_problem(root: Path, name: str, seed: str = SEED) -> Path:
    """A valid problem whose seed (`seed`, the source of `run(x, y)`) has 500 tunable values: the
    tuner never runs out."""
    folder = root / name
    (folder / "solutions").mkdir(parents=True)
    (folder / "definition.json").write_text(json.dumps({
        "name": name, "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}}, "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "def run(x):\n    return x * 2\n"}))
    (folder / "workload.jsonl").write_text(json.dumps({"uuid": f"{name}-8", "axes": {"n": 8},
                                                       "inputs": {"x": {"type": "random"}}}) + "\n")
    (folder / "solutions" / "seed.json").write_text(json.dumps({
        "name": f"{name}_seed", "definition": name, "author": "tests",
        "spec": {"languages": ["pytorch"], "target_hardware": ["CPU"], "entry_point": "main.py::run",
                 "destination_passing_style": True, "tunables": {"UNROLL": list(range(500))}},
        "sources": [{"path": "main.py", "content": seed}]}))
    return folder


class Worker:
    """One Celery worker process in its own session, logging to a file; `name` is its node name,
    kept when it is started again (an evaluator finds its own unfinished attempts by it)."""

    def __init__(self, name: str, app: str, options: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.app, self.options, self.env, self.log = name, app, options, env, log_dir / f"{name}.log"
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", self.app, "worker", "-n", f"{self.name}@test", "--without-gossip",
                 "--without-mingle", "-l", "INFO", *self.options],
                env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def kill(self) -> None:
        """SIGKILL to the worker process only, as the kernel's OOM killer would: what it started
        must go by itself."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def restart(self) -> None:
        if self.process.poll() is None:
            self.kill()
        self.process = self._start()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def counts(db: Database, campaign_id: int) -> dict[str, int]:
    """Assignments by status."""
    with db.session() as session:
        return dict(session.execute(select(AssignmentRow.status, func.count())
                                    .where(AssignmentRow.campaign_id == campaign_id)
                                    .group_by(AssignmentRow.status)).all())


def campaign_status(db: Database, campaign_id: int) -> str:
    with db.session() as session:
        return session.get(CampaignRow, campaign_id).status


def log_tails(log_dir: Path, chars: int = 3000) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(log_dir.glob("*.log")))
