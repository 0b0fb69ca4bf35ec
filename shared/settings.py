"""One Settings object per process, built by the entry point from KERNELSWARM_* variables."""

from __future__ import annotations

import difflib
import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.errors import UserError

PREFIX = "KERNELSWARM_"
Port = Annotated[int, Field(ge=1, le=65535)]
Positive = Annotated[int, Field(ge=1)]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Settings(BaseModel):
    """Working defaults for one machine: SQLite and the object store under `home`, Redis started
    by `kernelswarm up` when `redis_url` is not given."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Path(".kernelswarm")
    database_url: str | None = None
    redis_url: str | None = None
    store_url: str | None = None  # file:///dir (default under home) or s3://bucket
    minio_endpoint: str = "localhost:9000"
    minio_access_key: str = "minioadmin"
    minio_secret_key: str = "minioadmin"
    minio_secure: bool = False
    problems_dir: Path = Path("problems")
    device: str = "cpu"
    # Evaluation.
    correctness_rounds: int = 3
    timing_sets: int = 3  # timed input sets per workload at least (one per timed run while they fit)
    warmup_runs: int = 2
    timing_runs: int = 20
    timing_budget_s: float = 1.0
    attempt_timeout_s: float = 300.0
    workload_timeout_s: float = 120.0  # a child (candidate or reference) is killed when one workload makes no progress this long
    # A workload whose tensors (one input set and its outputs) take more bytes than this is refused by
    # `problems validate`, the submit form and the API (16 GiB: SOL-ExecBench's largest sample takes 9.4).
    max_workload_bytes: int = 16 << 30
    reference_timeout_s: float = 240.0  # the reference's child is killed after this long (its torch.compile baseline included)
    # Counting a workload's work for T_sol (shared.sol_bounded): the counting child's address space
    # (RLIMIT_AS, torch's 0.8 GB of reservations included) and its time per workload; past either, T_sol is unknown.
    sol_count_memory_mb: Positive = 6144
    sol_count_time_s: PositiveSeconds = 120.0
    scratch_dir: Path | None = None
    # The uid a problem's reference runs as where the evaluator is root (services/evaluator/sandbox):
    # one no account and no process on the host uses, neither root's nor `nobody`'s (the candidate's).
    reference_uid: int = 65533
    fork_server: bool = True  # fork children from a process with torch imported; false: a new interpreter each
    outer_clock_retimes: int = 3  # a timed batch over the outer clock's allowance is timed again at most this often
    calibrate: bool = True  # a GPU evaluator measures its ceilings at start when none younger than 7 days is stored
    # Writers and planner.
    writers: int = 3
    attempts_per_assignment: int = 4
    attempt_wait_s: float = 600.0
    lease_s: float = 60.0  # a writer that stops renewing its assignment this long loses it (it died)
    sweep_every_s: float = 15.0  # how often the planner looks for lost work (leases, deadlines, lost messages)
    tuner_eta: int = 3  # the tuner's successive halving keeps the best 1/eta of each rung; below 2: no halving
    web_port: Port = 8000
    # LLM writers: any OpenAI-compatible endpoint. The key and URL come from the standard
    # OPENAI_API_KEY / OPENAI_BASE_URL; without a key the built-in tuner writes instead.
    model: str = "gpt-4o-mini"
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    agent_turns: int = 16
    agent_evaluations: int = 8
    agent_tokens: int = 400_000
    agent_context_tokens: int = 32768  # the model's context: each request's history is trimmed to fit it
    agent_reply_tokens: int = 4096  # of that context, kept free for the model's reply
    agent_read_timeout_s: float = 300.0  # a streamed reply may be silent this long between two chunks
    agent_turn_timeout_s: float = 1800.0  # a reply that is not streamed (the endpoint refuses streaming) takes at most this
    agent_notes: int = 4  # notes (the `note` tool) one session may leave on its problem
    agent_retry_wait_s: float = 15.0  # a turn met by a rate limit or timeout is asked again after this, then twice it
    notes_budget_chars: int = 6000  # a problem's notes file (shared/notes.py): the planner trims it to this
    note_max_chars: int = 2000  # one `note` a writer appends
    submit_token: str | None = None  # at least 32 random characters (`kernelswarm token`); none: submitting is off
    submit_limit_per_hour: int = 60  # problems the web form and API accept in any hour, all clients together
    token_failures_per_window: Positive = 10  # wrong submit tokens one client address may send per window, then 429
    token_failure_window_s: PositiveSeconds = 300.0
    web_trusted_proxies: int = 0  # reverse proxies in front of the web whose X-Forwarded-For names the client
    log_level: str = "INFO"

    @field_validator("reference_uid")
    @classmethod
    def _a_uid_of_its_own(cls, uid: int) -> int:
        nobody = _nobody_uid()
        if not 0 < uid < 2**32 - 1 or uid == nobody:
            raise ValueError(f"the reference needs a uid of its own: a number from 1 to {2**32 - 2}, neither root's "
                             f"(0) nor nobody's ({nobody}, the candidate's); {uid} is not one")
        return uid

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home.resolve() / 'kernelswarm.db'}"

    @property
    def object_store_url(self) -> str:
        return self.store_url or f"file://{self.home.resolve() / 'store'}"

    @property
    def writer(self) -> str:
        """Who writes: "tuner", or "llm:<model>" when an endpoint key is set. A problem whose search
        one writer exhausted is open again to another (a campaign that continues waits for one)."""
        return f"llm:{self.model}" if self.openai_api_key else "tuner"

    @property
    def broker_url(self) -> str:
        if not self.redis_url:
            raise UserError("no Redis: set KERNELSWARM_REDIS_URL or start the swarm with `kernelswarm up`")
        return self.redis_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read `KERNELSWARM_<FIELD>` for every field; keyword overrides win."""
        environ = os.environ if environ is None else environ
        known = {PREFIX + name.upper() for name in cls.model_fields}
        unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in known)
        if unknown:
            hints = "; ".join(f"{k}{_did_you_mean(k, known)}" for k in unknown)
            raise UserError(f"unknown setting {hints} (settings are listed in shared/settings.py)")
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = PREFIX + name.upper()
            if key in environ and environ[key] != "":
                values[name] = environ[key]
        for name, key in (("openai_api_key", "OPENAI_API_KEY"), ("openai_base_url", "OPENAI_BASE_URL")):
            if environ.get(key):
                values[name] = environ[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(f"{PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}" for e in error.errors())
            raise UserError(f"bad settings: {problems}") from None


def _nobody_uid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


def _did_you_mean(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""
