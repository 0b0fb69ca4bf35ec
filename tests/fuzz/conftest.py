"""The fuzz tests' app (a migrated SQLite DB, a local store, the submit token, one RUNNING
campaign) and the count of generated cases per target, printed at the end of the run."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzzcases import CASES, TOKEN
from hypothesis.configuration import set_hypothesis_home_dir

from services.web import backends, create_app
from shared.db import CampaignProblemRow, CampaignRow, ProblemRow
from shared.db.session import Database
from shared.settings import Settings
from shared.store import LocalStore

# Hypothesis keeps caches (constants, unicode tables) even without an example database: not in the repo.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "kernelswarm-hypothesis")


class Web:
    """The app under fuzzing, its DB and store, and a test client whose session holds a CSRF token."""

    def __init__(self, tmp_path: Path) -> None:
        self.db = Database(f"sqlite:///{tmp_path}/fuzz.db")
        self.store = LocalStore(tmp_path / "store")
        settings = Settings(home=tmp_path, submit_token=TOKEN, submit_limit_per_hour=10**9,  # no rate limits here
                            token_failures_per_window=10**9)
        self.app = create_app(settings, self.db, self.store)
        self.app.config["TESTING"] = True  # an exception in a view reaches the test, not a 500 page
        with self.db.session() as session:
            problem = ProblemRow(name="existing", op_type="gemm", definition_json="{}", workloads_jsonl="")
            campaign = CampaignRow(name="running", status="RUNNING", device="cpu")
            session.add_all([problem, campaign])
            session.flush()
            session.add(CampaignProblemRow(campaign_id=campaign.id, problem_id=problem.id, position=0))
            self.campaign_id = campaign.id

    def client(self):
        return self.app.test_client()

    def close(self) -> None:
        self.app.extensions[backends.EXTENSION].close()
        self.db.dispose()


@pytest.fixture
def web(tmp_path) -> Iterator[Web]:
    app = Web(tmp_path)
    yield app
    app.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if CASES:
        terminalreporter.write_sep("-", f"fuzz cases: {sum(CASES.values())} in all")
        for target, number in sorted(CASES.items()):
            terminalreporter.write_line(f"{target}: {number}")
