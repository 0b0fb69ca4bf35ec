"""docker/compose_test.py's own pieces, without Docker: the problems it submits pass the web's
checks, and the settings it writes are ones the compose files and the services accept. (The stack
itself runs under `make compose-test`, which CI calls.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from services.web.submission import validate
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose_test():
    spec = importlib.util.spec_from_file_location("compose_test", REPO / "docker" / "compose_test.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("which", ["SUBMITTED", "SUBMITTED_AFTER"])
def test_the_submitted_problems_pass_the_webs_checks(compose_test, which: str):
    name = getattr(compose_test, which)
    body = compose_test.submitted_problem(name)
    problem = validate(body["definition"], body["workloads"])
    assert problem.name == name and len(problem.workloads) == 2


def test_the_library_problems_it_runs_exist_and_are_cpu_sized(compose_test):
    from kernelswarm.up import cpu_sized
    from shared.schema import load_problem

    problems = [load_problem(REPO / "problems" / name) for name in compose_test.LIBRARY_PROBLEMS]
    kept, left_out = cpu_sized(problems)
    assert not left_out and len(kept) == 2


def test_its_env_file_names_only_variables_the_stack_reads(compose_test, tmp_path: Path):
    env_file = tmp_path / "compose.env"
    bases = {"PYTHON_IMAGE": "p:1", "REDIS_IMAGE": "r:1", "POSTGRES_IMAGE": "pg:1", "S3_IMAGE": "s3:1"}
    compose_test.write_env(env_file, bases, standin=True)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    read = {"COMPOSE_PROFILES"}  # docker compose's own
    for name in ("docker-compose.yml", "docker/compose.cpu.yml", "docker/compose.s3-standin.yml"):
        read |= set(re.findall(r"\$\{(\w+)", (REPO / name).read_text()))
    assert set(env) <= read, set(env) - read
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("KERNELSWARM_")})
    assert settings.device == "cpu" and settings.submit_token
    assert (env["MINIO_ROOT_USER"], env["MINIO_ROOT_PASSWORD"]) == ("S3RVER", "S3RVER")  # the stand-in's account
    ports = [env[k] for k in env if k.endswith("_PORT")]
    assert len(set(ports)) == len(ports) == 6
