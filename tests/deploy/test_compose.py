"""docker-compose.yml as `docker-compose config` resolves it (Debian's docker-compose 1.29, which needs
no Docker engine for `config`; `make test` installs it), with no .env and with .env.example: the
services, GPU reservations, health checks, start order, restart policies, named volumes and the
settings every service gets; the Dockerfiles' pinned bases and non-root users."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from shared.celery_app import evaluate_queue
from shared.settings import PREFIX, Settings

REPO = Path(__file__).resolve().parents[2]
INFRA = {"redis", "postgres", "minio"}
EVALUATORS = ["evaluator", *(f"evaluator-{gpu}" for gpu in range(1, 8))]
CPU_EVALUATOR = "evaluator-cpu"  # profile `cpu`: the CPU stack (docker/compose.cpu.yml)
APPS = {"init", "planner", "worker", "web", *EVALUATORS, CPU_EVALUATOR}
LONG_RUNNING = (INFRA | APPS | {"flower"}) - {"init"}
VOLUMES = {"redis": ("redis-data", "/data"), "postgres": ("postgres-data", "/var/lib/postgresql/data"),
           "minio": ("minio-data", "/data")}
DOCKERFILES = [REPO / "docker" / "cpu.Dockerfile", REPO / "docker" / "gpu.Dockerfile"]


def compose_config(env_file: Path, *overrides: str) -> dict:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose not found: `make test` installs it (apt-get install docker-compose)")
    files = [arg for name in ("docker-compose.yml", *overrides) for arg in ("-f", str(REPO / name))]
    ran = subprocess.run([binary, *files, "--env-file", str(env_file), "config"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/local/bin:/usr/bin:/bin"})  # nothing of ours leaks into it
    assert ran.returncode == 0, ran.stderr
    return yaml.safe_load(ran.stdout)


@pytest.fixture(scope="module", params=["no .env", ".env.example"])
def config(request, tmp_path_factory) -> dict:
    if request.param == "no .env":
        env_file = tmp_path_factory.mktemp("compose") / "empty.env"
        env_file.write_text("")
    else:
        env_file = REPO / ".env.example"
    return compose_config(env_file)


@pytest.fixture(scope="module")
def services(config: dict) -> dict[str, dict]:
    return config["services"]


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def gpu_devices(service: dict) -> list[dict]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_services(services: dict):
    assert set(services) == INFRA | APPS | {"flower"}


def test_one_evaluator_per_gpu_pinned_with_concurrency_one(services: dict):
    for gpu, name in enumerate(EVALUATORS):
        service = services[name]
        [device] = gpu_devices(service)
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == [str(gpu)] and "count" not in device
        assert environment(service)["CUDA_VISIBLE_DEVICES"] == "0"  # its one GPU, as the container sees it
        command = service["command"]
        assert command[:4] == ["celery", "-A", "services.evaluator.entrypoint", "worker"]
        assert option(command, "--pool") == "solo" and option(command, "--concurrency") == "1"
        assert option(command, "--prefetch-multiplier") == "1"
        assert service["shm_size"] in ("16gb", 17179869184)
    assert "profiles" not in services["evaluator"]
    assert services["evaluator-1"]["profiles"] == ["gpu2", "gpu4", "gpu8"]
    assert services["evaluator-7"]["profiles"] == ["gpu8"]
    assert [n for n, s in services.items() if gpu_devices(s)] == EVALUATORS  # nobody else takes a GPU


def test_evaluators_consume_the_queue_tasks_are_routed_to(services: dict):
    """Writers and the web form send evaluate tasks to evaluate_queue(campaign device)."""
    for name in EVALUATORS:
        device = environment(services[name])["KERNELSWARM_DEVICE"]
        assert device == "cuda"
        assert option(services[name]["command"], "-Q") == evaluate_queue(device) == "evaluate.cuda"


def test_celery_services_and_web_commands(services: dict):
    assert services["planner"]["command"][:4] == ["celery", "-A", "services.planner.entrypoint", "worker"]
    assert option(services["planner"]["command"], "-Q") == "plan"
    assert option(services["planner"]["command"], "--pool") == "solo"
    assert option(services["worker"]["command"], "-Q") == "write"
    assert option(services["worker"]["command"], "--pool") == "threads"
    assert services["web"]["command"][0] == "gunicorn" and services["web"]["command"][-1] == "services.web.entrypoint:app"
    assert services["init"]["command"] == ["python", "docker/init.py"]
    assert option(services["redis"]["command"], "--appendonly") == "yes"


def test_every_long_running_service_has_a_health_check(services: dict):
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert not check.get("disable"), name
    assert "healthcheck" not in services["init"]
    for name in ("planner", *EVALUATORS, CPU_EVALUATOR):  # a solo worker busy with one attempt is not unhealthy
        check = services[name]["healthcheck"]
        interval_s = int(check["interval"].rstrip("s"))
        assert interval_s * check["retries"] >= 2 * Settings().attempt_timeout_s + 60, name


def test_start_order(services: dict):
    """Infrastructure healthy -> init (migrations, bucket) completed -> the KernelSwarm services."""
    def conditions(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in services[name].get("depends_on", {}).items()}

    assert conditions("init") == {"postgres": "service_healthy", "minio": "service_healthy"}
    for name in APPS - {"init"}:
        assert conditions(name) == {"init": "service_completed_successfully", "redis": "service_healthy"}, name
    assert conditions("flower") == {"redis": "service_healthy"}
    for name in INFRA:
        assert not conditions(name)


def test_restart_policies(services: dict):
    for name in LONG_RUNNING:
        assert services[name]["restart"] == "unless-stopped", name
    assert services["init"]["restart"] == "no"


def test_named_volumes_hold_the_state(config: dict, services: dict):
    assert set(config["volumes"]) == {volume for volume, _ in VOLUMES.values()}
    for name, (volume, target) in VOLUMES.items():
        mounts = services[name]["volumes"]
        assert any((m["source"], m["target"], m["type"]) == (volume, target, "volume") if isinstance(m, dict)
                   else m == f"{volume}:{target}:rw" or m == f"{volume}:{target}" for m in mounts), (name, mounts)
    for name in APPS | {"flower"}:  # nothing that matters is stored on a worker
        assert not services[name].get("volumes"), name


def test_every_service_builds_its_settings_from_its_environment(services: dict):
    """Settings.from_env refuses unknown KERNELSWARM_ names and bad values, as each service would."""
    for name in APPS:
        settings = Settings.from_env(environment(services[name]))
        assert settings.db_url.startswith("postgresql://") and "@postgres:5432/" in settings.db_url
        assert settings.broker_url.startswith("redis://") and "@redis:6379/" in settings.broker_url
        assert settings.object_store_url == "s3://kernelswarm" and settings.minio_endpoint == "minio:9000"
        assert settings.device == ("cpu" if name == CPU_EVALUATOR else "cuda")


def test_infrastructure_credentials_match_what_services_use(services: dict):
    settings = Settings.from_env(environment(services["planner"]))
    postgres, minio = environment(services["postgres"]), environment(services["minio"])
    assert f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@" in settings.db_url
    assert settings.db_url.endswith("/" + postgres["POSTGRES_DB"])
    assert (settings.minio_access_key, settings.minio_secret_key) == (minio["MINIO_ROOT_USER"],
                                                                      minio["MINIO_ROOT_PASSWORD"])
    assert len(minio["MINIO_ROOT_PASSWORD"]) >= 8  # MinIO refuses to start otherwise
    password = option(services["redis"]["command"], "--requirepass")
    assert settings.broker_url.startswith(f"redis://:{password}@")
    assert environment(services["flower"])["CELERY_BROKER_URL"] == settings.broker_url


def test_images_are_pinned(services: dict):
    for name, service in services.items():
        image = service["image"]
        if "build" in service:
            assert image.startswith("kernelswarm-"), name
        else:
            tag = image.rsplit(":", 1)[1] if ":" in image else ""
            assert tag and tag != "latest" and re.search(r"\d", tag), (name, image)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_pin_their_bases_and_run_as_a_user(dockerfile: Path):
    text = dockerfile.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    [base] = re.findall(r"^FROM (\S+)", text, re.M)
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(r"[\w./-]+:\d[\w.-]*", base), base  # a version tag, not latest
    for name, value in args.items():
        if name.endswith("_VERSION"):
            assert re.fullmatch(r"\d[\w.]*", value), (name, value)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0", "0:0")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_build_context_holds_what_the_dockerfile_copies_and_no_more(dockerfile: Path):
    """The root .dockerignore: the legacy builder reads no <Dockerfile>.dockerignore."""
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignore  # everything out, then back in by name
    kept = {line[1:] for line in ignore if line.startswith("!")}
    copied = set()
    for sources in re.findall(r"^COPY (.+) \S+$", dockerfile.read_text(), re.M):
        copied |= set(sources.split())
    assert copied == kept
    assert all((REPO / path).exists() for path in copied)


def test_env_example_lists_every_setting_and_nothing_else():
    text = (REPO / ".env.example").read_text()
    names = set(re.findall(r"^#? ?(KERNELSWARM_\w+)=", text, re.M))
    standard = {"openai_api_key": "OPENAI_API_KEY", "openai_base_url": "OPENAI_BASE_URL"}  # their usual names
    assert names == {PREFIX + field.upper() for field in Settings.model_fields if field not in standard}
    assert set(standard.values()) <= set(re.findall(r"^(\w+)=", text, re.M))


def test_compose_passes_every_setting_in_env_example_to_the_services(services: dict):
    """An uncommented setting in .env.example reaches the services (the rest are composed or set
    by the images, and say so)."""
    text = (REPO / ".env.example").read_text()
    settable = set(re.findall(r"^(KERNELSWARM_\w+|OPENAI_\w+)=", text, re.M))
    for name in APPS:
        assert settable <= set(environment(services[name])), (name, settable - set(environment(services[name])))


def dockerfile_args(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), re.M))


def test_the_cpu_evaluator_takes_the_cpu_queue_as_root_for_its_sandbox(services: dict):
    service = services[CPU_EVALUATOR]
    assert service["profiles"] == ["cpu"]
    assert service["image"] == services["worker"]["image"] and service["build"] == services["worker"]["build"]
    command = service["command"]
    assert command[:4] == ["celery", "-A", "services.evaluator.entrypoint", "worker"]
    assert option(command, "-Q") == evaluate_queue("cpu") == "evaluate"
    assert option(command, "--pool") == "solo" and option(command, "--concurrency") == "1"
    assert environment(service)["KERNELSWARM_DEVICE"] == "cpu"
    assert service["user"] == "0:0" and service["cap_add"] == ["SYS_ADMIN"]
    assert not gpu_devices(service)


def test_the_cpu_file_turns_the_gpu_evaluator_off_and_changes_nothing_else(tmp_path: Path):
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    base = compose_config(env_file)["services"]
    cpu = compose_config(env_file, "docker/compose.cpu.yml")["services"]
    assert cpu["evaluator"].pop("profiles") == ["gpu"]
    assert cpu == base


def test_the_s3_stand_in_takes_minios_place_with_its_volume_and_ports(tmp_path: Path):
    env_file = tmp_path / "standin.env"
    env_file.write_text("S3_IMAGE=kernelswarm-local/s3:s3rver-3.7.1\n")
    base = compose_config(env_file)["services"]["minio"]
    standin = compose_config(env_file, "docker/compose.cpu.yml", "docker/compose.s3-standin.yml")["services"]["minio"]
    assert standin["image"] == "kernelswarm-local/s3:s3rver-3.7.1"
    assert "--no-vhost-buckets" in standin["command"]  # the service's name is a host, not a bucket
    assert standin["healthcheck"]["test"][0] == "CMD"
    for key in ("volumes", "ports", "restart", "environment"):
        assert standin[key] == base[key], key


def test_every_base_is_a_variable_defaulting_to_the_pinned_upstream_one(services: dict, tmp_path: Path):
    assert services["worker"]["build"]["args"]["PYTHON_IMAGE"] == \
        dockerfile_args(REPO / "docker" / "cpu.Dockerfile")["PYTHON_IMAGE"]
    assert services["evaluator"]["build"]["args"]["CUDA_IMAGE"] == \
        dockerfile_args(REPO / "docker" / "gpu.Dockerfile")["CUDA_IMAGE"]
    local = {"REDIS_IMAGE": "local/redis:1", "POSTGRES_IMAGE": "local/postgres:1", "MINIO_IMAGE": "local/minio:1",
             "PYTHON_IMAGE": "local/python:1", "CUDA_IMAGE": "local/cuda:1", "REDIS_PORT": "16379"}
    env_file = tmp_path / "local.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in local.items()))
    resolved = compose_config(env_file)["services"]
    assert [resolved[name]["image"] for name in ("redis", "postgres", "minio")] == \
        ["local/redis:1", "local/postgres:1", "local/minio:1"]
    assert all(resolved[name]["build"]["args"]["PYTHON_IMAGE"] == "local/python:1" for name in ("worker", "web"))
    assert resolved["evaluator"]["build"]["args"]["CUDA_IMAGE"] == "local/cuda:1"
    assert any(str(port.get("published")) == "16379" if isinstance(port, dict) else port.split(":")[-2] == "16379"
               for port in resolved["redis"]["ports"])


def test_local_bases_prints_the_variables_the_compose_files_read():
    script = (REPO / "docker" / "local-bases.sh").read_text()
    printed = set(re.findall(r"^(\w+_IMAGE)=", script.split('VARS="', 1)[1].split('"', 1)[0], re.M))
    read = set()
    for name in ("docker-compose.yml", "docker/compose.s3-standin.yml"):
        read |= set(re.findall(r"\$\{(\w+_IMAGE)[:}-]", (REPO / name).read_text()))
    assert printed == {"PYTHON_IMAGE", "REDIS_IMAGE", "POSTGRES_IMAGE", "S3_IMAGE"}
    assert printed <= read
