"""The setting for a `kernelswarm up` run in a test: one tiny CPU problem in its own folder, the
home and web port of the test's own, `up`'s services replaced by the test's, and the root logger
put back afterwards (`up` configures logging)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kernelswarm import up
from kernelswarm.launcher import Services, free_port


def prepare_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, services: type[Services]) -> int:
    """Everything `up` reads, under `tmp_path`; the web's port."""
    problem = tmp_path / "problems" / "scale"
    problem.mkdir(parents=True)
    (problem / "definition.json").write_text(json.dumps({
        "name": "scale", "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}}, "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "def run(x):\n    return x * 2\n"}))
    (problem / "workload.jsonl").write_text(json.dumps(
        {"uuid": "scale-8", "axes": {"n": 8}, "inputs": {"x": {"type": "random"}}}) + "\n")
    port = free_port()
    for name, value in (("HOME", tmp_path / "home"), ("PROBLEMS_DIR", tmp_path / "problems"),
                        ("WEB_PORT", port), ("DEVICE", "cpu")):
        monkeypatch.setenv(f"KERNELSWARM_{name}", str(value))
    monkeypatch.setattr(up, "Services", services)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    return port
