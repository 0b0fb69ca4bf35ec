"""shared.settings: KERNELSWARM_* variables, working defaults, errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.errors import UserError
from shared.settings import Settings


def test_defaults_work_on_one_machine(tmp_path: Path):
    settings = Settings.from_env({}, home=tmp_path)

    assert settings.db_url == f"sqlite:///{tmp_path.resolve() / 'kernelswarm.db'}"
    assert settings.object_store_url == f"file://{tmp_path.resolve() / 'store'}"
    assert settings.device == "cpu"
    assert settings.minio_secure is False
    assert settings.correctness_rounds == 3
    assert settings.scratch_dir is None


def test_default_home_is_relative():
    assert Settings.from_env({}) == Settings()
    assert Settings().home == Path(".kernelswarm")


def test_broker_url_needs_redis():
    with pytest.raises(UserError, match="KERNELSWARM_REDIS_URL"):
        Settings().broker_url
    assert Settings(redis_url="redis://127.0.0.1:6390/0").broker_url == "redis://127.0.0.1:6390/0"


def test_explicit_urls_win_over_defaults():
    settings = Settings(database_url="postgresql://db/ks", store_url="s3://objects")

    assert (settings.db_url, settings.object_store_url) == ("postgresql://db/ks", "s3://objects")


def test_env_values_are_parsed():
    settings = Settings.from_env({
        "KERNELSWARM_HOME": "/srv/ks",
        "KERNELSWARM_SCRATCH_DIR": "/tmp/scratch",
        "KERNELSWARM_CORRECTNESS_ROUNDS": "5",
        "KERNELSWARM_WEB_PORT": " 8080 ",
        "KERNELSWARM_TIMING_BUDGET_S": "0.5",
        "KERNELSWARM_MINIO_SECURE": "true",
        "KERNELSWARM_DATABASE_URL": "postgresql://user:p%40ss@db/ks",
        "KERNELSWARM_DEVICE": "cuda:1",
    })

    assert settings.home == Path("/srv/ks")
    assert settings.scratch_dir == Path("/tmp/scratch")
    assert settings.correctness_rounds == 5
    assert settings.web_port == 8080
    assert settings.timing_budget_s == 0.5
    assert settings.minio_secure is True
    assert settings.db_url == "postgresql://user:p%40ss@db/ks"
    assert settings.device == "cuda:1"


@pytest.mark.parametrize(("value", "expected"), [
    ("true", True), ("True", True), ("1", True), ("yes", True), ("on", True),
    ("false", False), ("FALSE", False), ("0", False), ("no", False), ("off", False),
])
def test_env_bools(value: str, expected: bool):
    assert Settings.from_env({"KERNELSWARM_MINIO_SECURE": value}).minio_secure is expected


def test_empty_variable_means_default():
    assert Settings.from_env({"KERNELSWARM_WRITERS": "", "KERNELSWARM_REDIS_URL": ""}) == Settings()


def test_other_variables_are_ignored():
    settings = Settings.from_env({"WRITERS": "9", "kernelswarm_writers": "9", "HOME": "/root"})

    assert settings.writers == 3
    assert settings.home == Path(".kernelswarm")


def test_reads_the_process_environment_when_not_given(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KERNELSWARM_WRITERS", "7")

    assert Settings.from_env().writers == 7
    assert Settings().writers == 3  # building Settings directly never reads the environment


def test_overrides_win_over_env():
    environ = {"KERNELSWARM_WRITERS": "7", "KERNELSWARM_DEVICE": "cuda"}

    settings = Settings.from_env(environ, writers=3, device=None)

    assert settings.writers == 3
    assert settings.device == "cuda"  # a None override leaves the env value


@pytest.mark.parametrize(("variable", "value"), [
    ("KERNELSWARM_TIMING_RUNS", "many"),
    ("KERNELSWARM_TIMING_BUDGET_S", "2s"),
    ("KERNELSWARM_MINIO_SECURE", "maybe"),
    ("KERNELSWARM_WEB_PORT", "80.5"),
])
def test_bad_value_names_the_variable(variable: str, value: str):
    with pytest.raises(UserError) as raised:
        Settings.from_env({variable: value})

    assert raised.value.http_status == 400
    assert f"{variable}: " in str(raised.value)


def test_every_bad_variable_is_named():
    with pytest.raises(UserError) as raised:
        Settings.from_env({"KERNELSWARM_TIMING_RUNS": "x", "KERNELSWARM_WRITERS": "y"})

    assert "KERNELSWARM_TIMING_RUNS" in str(raised.value)
    assert "KERNELSWARM_WRITERS" in str(raised.value)


def test_bad_override_names_the_field():
    with pytest.raises(UserError, match="KERNELSWARM_WRITERS"):
        Settings.from_env({}, writers="several")
    with pytest.raises(UserError, match="KERNELSWARM_NO_SUCH_SETTING"):
        Settings.from_env({}, no_such_setting=1)


def test_settings_are_frozen():
    with pytest.raises(ValidationError):
        Settings().writers = 2


def test_a_misspelt_setting_is_an_error_that_suggests_the_right_name():
    with pytest.raises(UserError, match="KERNELSWARM_REDIS_ULR.*did you mean KERNELSWARM_REDIS_URL"):
        Settings.from_env({"KERNELSWARM_REDIS_ULR": "redis://x"})


def test_the_llm_endpoint_comes_from_the_standard_openai_variables():
    settings = Settings.from_env({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                                  "KERNELSWARM_MODEL": "qwen3-coder"})
    assert settings.openai_api_key == "sk-test"
    assert settings.openai_base_url == "http://127.0.0.1:9/v1"
    assert settings.model == "qwen3-coder"
    assert Settings.from_env({}).openai_api_key is None


def test_the_outer_clocks_re_times_come_from_the_environment(tmp_path) -> None:
    from services.evaluator.evaluate import EvalConfig

    settings = Settings.from_env({"KERNELSWARM_OUTER_CLOCK_RETIMES": "5"}, home=tmp_path)
    assert EvalConfig.from_settings(settings).outer_clock_retimes == 5
    assert EvalConfig.from_settings(Settings.from_env({}, home=tmp_path)).outer_clock_retimes == 3
