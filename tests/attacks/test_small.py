"""Issue 40, row L and item 5's modes and passwords (the `small` part): each attack beside an honest
control through the same stage.

- the wrong-token throttle: 120 wrong tokens sent at once compare at most the allowed 10;
- every number of the `kernelswarm` CLI bounded (exit 2, the argument named, no traceback), and
  `eval -o` checked before the evaluation runs;
- KERNELSWARM_REFERENCE_UID a real setting;
- the swarm's home 0700, its DB 0600;
- `up`'s private Redis behind a random password.
"""

from __future__ import annotations

import pytest
from smallkit import TOKEN, a_campaign, at_once, close_app, web_app

from shared.db import Database

LIMIT, WRONG_AT_ONCE = 10, 120


@pytest.fixture
def db(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    yield database
    database.dispose()


# --- the wrong-token throttle ------------------------------------------------------------------------


def test_wrong_tokens_sent_at_once_compare_at_most_the_limit(tmp_path, db):
    """Attack: 120 wrong tokens at once from one address. Checked, then recorded in two steps, all
    of them passed the check before any was recorded (each a guess compared); counted before the
    comparison in the same step as the check, 10 are compared and 110 refused (429)."""
    app = web_app(tmp_path, db, token_failures_per_window=LIMIT)
    campaign = a_campaign(db)
    try:
        codes = at_once(WRONG_AT_ONCE, lambda: app.test_client().post(
            f"/api/campaigns/{campaign}/pause", headers={"Authorization": "Bearer wrong-" + TOKEN}).status_code)
        assert codes[401] == LIMIT and codes[429] == WRONG_AT_ONCE - LIMIT, codes
    finally:
        close_app(app)


def test_right_tokens_sent_at_once_all_pass_and_count_nothing(tmp_path, db):
    """Control: the right token, many at once (within the limit in flight), is taken every time and
    leaves nothing counted: a wrong one afterwards is still compared (401, not 429)."""
    app = web_app(tmp_path, db, token_failures_per_window=LIMIT)
    campaign = a_campaign(db)
    try:
        client = app.test_client()
        codes = at_once(LIMIT, lambda: app.test_client().post(
            f"/api/campaigns/{campaign}/pause", headers={"Authorization": f"Bearer {TOKEN}"}).status_code)
        assert codes == {200: LIMIT}, codes
        for _ in range(LIMIT):
            assert client.post(f"/api/campaigns/{campaign}/resume",
                               headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert client.post(f"/api/campaigns/{campaign}/pause",
                           headers={"Authorization": "Bearer wrong"}).status_code == 401
    finally:
        close_app(app)
