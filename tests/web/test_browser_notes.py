"""A problem's notes after a scripted campaign (tests/web/notes_campaign.py), on its page in headless
Chromium: the trimmed file and its history, a writer's HTML shown as text and never run.

`WEB_SCREENSHOTS_DIR=docs/screenshots pytest tests/web/test_browser_notes.py` refreshes
docs/screenshots/problem-notes.png (test_browser.py says how the browser is driven)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from notes_campaign import HOSTILE, PROBLEM, SESSIONS, run_campaign
from test_browser import CHROMEDRIVER, CHROMIUM, WIDTH, Served, browser, csp_violations, shots, wait  # noqa: F401 (fixtures)

from services.web import create_app
from shared.settings import Settings

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="needs Debian's chromium and chromium-driver (make setup installs them)")


class NotesSite:
    """The web app on the campaign's DB and store (`Served`)."""

    def __init__(self, root) -> None:
        self.campaign = run_campaign(root)
        runtime = self.campaign.runtime
        self.served = Served(create_app(Settings(home=root), runtime.db, runtime.store))
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()
        self.campaign.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[NotesSite]:
    running = NotesSite(tmp_path_factory.mktemp("notes-site"))
    yield running
    running.stop()


def test_the_notes_of_a_campaign_on_the_problem_page(site, browser, shots):
    assert site.campaign.trimmed == [site.campaign.problem_id]  # the campaign's notes outgrew the budget
    csp_violations(browser)  # drop what earlier tests left
    browser.get(f"{site.url}/problems/{PROBLEM}")
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "h1").text == PROBLEM)

    notes = browser.find_element(By.ID, "notes-file")
    text = notes.text
    assert text.startswith(f"# Notes: {PROBLEM}")
    # The newest in full, then by support: the two records (PASSED, each beating the best before it)
    # in full; the two failures, evidence but no record, left out at this budget.
    assert "2 earlier entries are not shown" in text
    assert SESSIONS[-1].note.splitlines()[0][:60] in text
    assert SESSIONS[2].note.splitlines()[0] in text and "| 1024 | 0.062 |" in text
    assert SESSIONS[1].note.splitlines()[1][:60] in text
    assert SESSIONS[0].note[:40] not in text and SESSIONS[3].note[:40] not in text
    assert text.count(" · attempt ") == 3  # each entry names the attempt it was written after
    assert "qwen3-coder-480b" in text

    # A writer's HTML is text on the page: shown as written, never parsed or run.
    assert HOSTILE in text
    assert browser.title.startswith(PROBLEM) and not browser.find_elements(By.CSS_SELECTOR, "#notes img, #notes script")
    assert browser.execute_script("return document.getElementById('notes-file').children.length") == 0  # no markup parsed

    summary = browser.find_element(By.CSS_SELECTOR, "#note-history summary")
    assert summary.text == f"history: the latest {len(SESSIONS)} of {len(SESSIONS)} entries"
    summary.click()
    rows = wait(browser, lambda d: [r for r in d.find_elements(By.CSS_SELECTOR, "#note-entries tbody tr")
                                    if r.is_displayed()])
    shown = [r.find_elements(By.TAG_NAME, "td")[4].text for r in rows]
    assert shown == ["in full", "dropped", "in full", "in full", "dropped"]  # newest first
    assert all(r.find_elements(By.TAG_NAME, "td")[3].text not in ("", "–") for r in rows)  # each with its attempt
    assert {r.find_elements(By.TAG_NAME, "td")[2].text for r in rows} == {"qwen3-coder-480b"}
    assert "every entry (JSON)" in browser.find_element(By.ID, "notes").text
    assert csp_violations(browser) == []

    browser.execute_script("window.scrollTo(0, document.getElementById('notes').offsetTop - 12)")
    browser.set_window_size(WIDTH, 1100)
    path = shots / "problem-notes.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000
    browser.set_window_size(WIDTH, 1000)
