"""The site in headless Chromium (Debian's chromium, driven by Selenium through chromedriver) on a
seeded DB, served by werkzeug on a free loopback port in a thread, with a real redis-server: every
page loads, the leaderboard sorts and filters (and keeps both across its refresh), the chart names
the attempt under the pointer, one invalid and one valid problem are submitted, a campaign is paused;
no page breaks the Content-Security-Policy (the browser's console names every violation).

Screenshots go to $WEB_SCREENSHOTS_DIR when set (`WEB_SCREENSHOTS_DIR=docs/screenshots pytest
tests/web/test_browser.py` refreshes the committed ones), else to the test's temp folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import select
from webdemo import seed_demo
from webseed import TOKEN

from kernelswarm.launcher import RedisServer
from services.web import backends, create_app
from services.web import leaderboard as leaderboard_page
from services.web.serving import make_server
from services.web import status as status_page
from shared.db import AttemptRow, CampaignRow, Database, ProblemRow
from shared.settings import Settings
from shared.store import LocalStore

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="needs Debian's chromium and chromium-driver (make setup installs them)")
WIDTH = 1440
MAX_SHOT_HEIGHT = 2600
WAIT_S = 20
NEW_PROBLEM = {
    "name": "browser_scale", "op_type": "elementwise", "description": "y = x * w, submitted from the browser test.",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, w):\n    return x * w\n",
}
WORKLOADS = [{"uuid": f"n{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}}}
             for n in (1024, 65536)]


class Served:
    """A web app served by werkzeug in a thread of this process, at `url`."""

    def __init__(self, app) -> None:
        self.app = app
        self.server = make_server("127.0.0.1", 0, app)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)
        self.app.extensions[backends.EXTENSION].close()


class Site:
    def __init__(self, root: Path) -> None:
        self.redis = RedisServer(root / "redis")
        self.db = Database(f"sqlite:///{root}/site.db")
        self.store = LocalStore(root / "store")
        self.demo = seed_demo(self.db, self.store)
        self.served = Served(create_app(Settings(home=root, submit_token=TOKEN, redis_url=self.redis.url),
                                        self.db, self.store))
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()
        self.db.dispose()
        self.redis.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(status_page, "REFRESH_S", 0)  # no reload of the status page while the test reads it
        running = Site(tmp_path_factory.mktemp("site"))
        yield running
        running.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path_factory.mktemp("profile"))
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={WIDTH},1000",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console: CSP violations
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("WEB_SCREENSHOTS_DIR") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver, folder: Path, name: str) -> Path:
    """The whole page (up to MAX_SHOT_HEIGHT) as a PNG."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(height, MAX_SHOT_HEIGHT))
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path))
    driver.set_window_size(WIDTH, 1000)
    assert path.stat().st_size > 10_000
    return path


def wait(driver, condition, timeout_s: float = WAIT_S):
    """Until `condition` holds; an element that went away because a page was still loading is a retry."""
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout_s, ignored_exceptions=ignored).until(condition)


def column(driver, index: int) -> list[str]:
    return [row.find_elements(By.TAG_NAME, "td")[index].text
                    for row in driver.find_elements(By.CSS_SELECTOR, "#leaderboard tbody tr") if row.is_displayed()]


def figure(text: str) -> float | None:
    """The cell's figure: "0.912", "5.93x", "5.93x (16 w)" (the count of workloads behind a geomean)."""
    return None if text.strip() in ("—", "") else float(re.match(r"[\d.]+", text.strip()).group(0))


def test_leaderboard_loads_sorts_and_filters(site, browser, shots, monkeypatch):
    monkeypatch.setattr(leaderboard_page, "REFRESH_S", 2)  # the page's own refresh, waited for below
    browser.get(site.url + "/")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Leaderboard"
    rows = browser.find_elements(By.CSS_SELECTOR, "#leaderboard tbody tr")
    assert len(rows) == len(site.demo.problems) + 2
    cards = browser.find_element(By.CSS_SELECTOR, "section.cards").text
    assert "geomean speedup over T" in cards and "median SOL score" in cards and "GPU hours" in cards
    scores = [figure(t) for t in column(browser, 4)]
    assert scores[:len(site.demo.problems)] == sorted(scores[:len(site.demo.problems)], reverse=True)
    bars = browser.find_elements(By.CSS_SELECTOR, "#leaderboard svg.bar rect")
    assert bars and max(bar.rect["width"] for bar in bars) > 10  # drawn, not blocked
    screenshot(browser, shots, "leaderboard")

    header = browser.find_element(By.XPATH, "//table[@id='leaderboard']//th[normalize-space()='vs eager']")
    header.click()  # numbers sort high to low first, missing figures last
    speedups = [figure(t) for t in column(browser, 6)]
    known = [s for s in speedups if s is not None]
    assert known == sorted(known, reverse=True) and speedups[len(known):] == [None] * (len(speedups) - len(known))
    header.click()
    assert [figure(t) for t in column(browser, 6) if figure(t) is not None] == sorted(known)
    assert header.get_attribute("aria-sort") == "ascending"

    name_header = browser.find_element(By.XPATH, "//table[@id='leaderboard']//th[normalize-space()='problem']")
    name_header.click()
    names = column(browser, 1)
    assert names == sorted(names, key=str.lower)

    box = browser.find_element(By.ID, "filter")
    box.send_keys("llama31")
    assert all("llama31" in n for n in column(browser, 1)) and len(column(browser, 1)) == 3
    assert browser.find_element(By.ID, "shown-count").text == f"3 of {len(rows)} problems"
    Select(browser.find_element(By.ID, "op-filter")).select_by_value("rmsnorm")
    assert column(browser, 1) == ["llama31_8b_rmsnorm"]

    # Left alone, the page refreshes itself; the sort and the filters survive (they live in the URL's hash).
    browser.find_element(By.TAG_NAME, "h1").click()
    stale = browser.find_element(By.TAG_NAME, "h1")
    wait(browser, lambda d: _is_stale(stale), leaderboard_page.REFRESH_S * 3)
    wait(browser, lambda d: d.find_element(By.ID, "filter").get_attribute("value") == "llama31")
    assert column(browser, 1) == ["llama31_8b_rmsnorm"]
    assert "op-filter=rmsnorm" in browser.current_url
    name_header = browser.find_element(By.XPATH, "//table[@id='leaderboard']//th[normalize-space()='problem']")
    assert name_header.get_attribute("aria-sort") == "ascending"


def _is_stale(element) -> bool:
    try:
        element.is_displayed()
    except StaleElementReferenceException:
        return True
    return False


def test_problem_page_chart_names_the_attempt_under_the_pointer(site, browser, shots):
    name = site.demo.problems[0]
    browser.get(site.url + "/")
    browser.find_element(By.LINK_TEXT, name).click()
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "h1").text == name)

    points = browser.find_elements(By.CSS_SELECTOR, "svg.history .pt-pass")
    assert len(points) > 5 and browser.find_elements(By.CSS_SELECTOR, "svg.history .pt-fail")
    assert browser.find_element(By.CSS_SELECTOR, "svg.history path.best").get_attribute("d").startswith("M")
    best = points[-1]
    ActionChains(browser).move_to_element(best).perform()
    tip = browser.find_element(By.CSS_SELECTOR, ".chart .tip")
    wait(browser, lambda d: tip.is_displayed())
    assert tip.text.startswith(f"attempt {best.get_attribute('data-attempt')[:8]} · PASSED")
    for heading in ("Per workload (best attempt)", "Best solution", "Attempts", "Definition", "Workloads"):
        assert browser.find_element(By.XPATH, f"//h2[normalize-space()='{heading}']")
    assert browser.find_elements(By.CSS_SELECTOR, ".hl .k")  # highlighted keywords
    assert browser.find_element(By.PARTIAL_LINK_TEXT, "download solution.json")
    shot = screenshot(browser, shots, "problem")
    assert shot.exists()


def test_submit_refuses_an_invalid_problem_beside_its_field(site, browser, shots):
    browser.get(site.url + "/submit")
    broken = {**NEW_PROBLEM, "reference": "import torch\n\n\ndef forward(x, w):\n    return x * w\n"}
    _paste(browser, "definition", json.dumps(broken, indent=2))
    _paste(browser, "workloads", "".join(json.dumps(w) + "\n" for w in WORKLOADS))
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "submit-button").click()

    errors = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#errors-definition li"))
    assert "reference must define a top-level function `run`" in errors[0].text
    assert not browser.find_elements(By.CSS_SELECTOR, "#errors-workloads li")
    assert "has-error" in browser.find_element(By.ID, "field-definition").get_attribute("class")
    screenshot(browser, shots, "submit-invalid")
    with site.db.session() as session:
        assert session.scalar(select(ProblemRow.id).where(ProblemRow.name == NEW_PROBLEM["name"])) is None


def test_submit_refuses_a_field_over_its_limit_in_the_browser_and_keeps_the_text(site, browser):
    """3 MiB pasted: over the field's limit and over the whole request's, which the server would not read."""
    browser.get(site.url + "/submit")
    _paste(browser, "definition", json.dumps(NEW_PROBLEM, indent=2))
    pasted = "".join(json.dumps(w) + "\n" for w in WORKLOADS) * (3 * 1024 * 1024 // 200)
    _paste(browser, "workloads", pasted)
    browser.find_element(By.ID, "submit-button").click()

    errors = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#errors-workloads li"))
    assert errors[0].text.startswith("workload.jsonl is larger than 1024 KiB (")
    assert errors[0].text.endswith("KiB): nothing was sent, the text is still here")
    assert browser.find_element(By.ID, "workloads").get_attribute("value") == pasted
    assert "has-error" in browser.find_element(By.ID, "field-workloads").get_attribute("class")
    assert not browser.find_elements(By.CSS_SELECTOR, "#errors-definition li")


def test_submit_a_valid_problem_from_files(site, browser, shots, tmp_path):
    definition, workloads = tmp_path / "definition.json", tmp_path / "workload.jsonl"
    definition.write_text(json.dumps(NEW_PROBLEM, indent=2))
    workloads.write_text("".join(json.dumps(w) + "\n" for w in WORKLOADS))
    browser.get(site.url + "/submit")
    browser.find_element(By.ID, "definition_file").send_keys(str(definition))
    browser.find_element(By.ID, "workloads_file").send_keys(str(workloads))
    assert not browser.find_elements(By.ID, "token")  # the right token given once logged this browser in
    browser.find_element(By.ID, "submit-button").click()

    done = wait(browser, lambda d: d.find_elements(By.ID, "submitted"))
    assert "2 workloads" in done[0].text
    assert "is queued for the evaluator" in browser.find_element(By.TAG_NAME, "main").text
    screenshot(browser, shots, "submit-ok")
    with site.db.session() as session:
        problem_id = session.scalar(select(ProblemRow.id).where(ProblemRow.name == NEW_PROBLEM["name"]))
        attempt = session.scalars(select(AttemptRow).where(AttemptRow.problem_id == problem_id)).one()
    assert (attempt.device, attempt.campaign_id, attempt.status) == ("h200", site.demo.campaign_id, "PENDING")
    client = redis.Redis.from_url(site.redis.url)
    try:
        assert client.llen("evaluate.h200") == 1
    finally:
        client.close()

    browser.find_element(By.LINK_TEXT, "Go to the problem's page").click()
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "h1").text == NEW_PROBLEM["name"])
    assert "No PASSED attempt yet." in browser.find_element(By.TAG_NAME, "main").text


def test_status_shows_the_queue_and_pauses_the_campaign(site, browser, shots):
    browser.get(site.url + "/status")
    depths = {row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[1].text
              for row in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr")}
    assert depths["evaluate.h200"] == "1"  # the reference check of the submitted problem
    assert browser.find_elements(By.CSS_SELECTOR, "#errors tbody tr")

    browser.find_element(By.CSS_SELECTOR, "header form button.link").click()  # log out, then in again
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "header .account a"))  # the "log in" link is back
    browser.get(site.url + "/status")
    browser.find_element(By.LINK_TEXT, "log in to pause").click()
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form.submit button[type=submit]").click()
    pause = wait(browser, lambda d: d.find_elements(By.ID, f"pause-{site.demo.campaign_id}"))
    pause[0].click()

    wait(browser, lambda d: "is PAUSED" in d.find_element(By.CSS_SELECTOR, ".flash").text)
    assert browser.find_element(By.ID, f"resume-{site.demo.campaign_id}")
    with site.db.session() as session:
        assert session.get(CampaignRow, site.demo.campaign_id).status == "PAUSED"
    row = browser.find_element(By.ID, f"campaign-{site.demo.campaign_id}")
    assert "paused on the web" in row.text  # why, beside the status
    screenshot(browser, shots, "status")
    browser.find_element(By.ID, f"resume-{site.demo.campaign_id}").click()
    wait(browser, lambda d: "is RUNNING" in d.find_element(By.CSS_SELECTOR, ".flash").text)
    assert "paused on the web" not in browser.find_element(By.ID, f"campaign-{site.demo.campaign_id}").text


def test_status_says_why_a_campaign_is_idle_or_stopped(site, browser):
    """The states of a campaign's lifecycle, each with its reason: idle (a continuous campaign
    whose problems are all retired, still RUNNING) and stopped (a budget)."""
    with site.db.session() as session:
        idle = CampaignRow(name="local continuous", status="RUNNING", device="cpu", continuous=True,
                           status_reason="idle: every problem retired (5)")
        ended = CampaignRow(name="nightly", status="STOPPED", device="h200", status_reason="token budget spent")
        session.add_all([idle, ended])
        session.flush()
        ids = idle.id, ended.id
    try:
        browser.get(site.url + "/status")
        idle_row = browser.find_element(By.ID, f"campaign-{ids[0]}").text
        ended_row = browser.find_element(By.ID, f"campaign-{ids[1]}").text
        assert "RUNNING" in idle_row and "idle: every problem retired (5)" in idle_row
        assert "STOPPED" in ended_row and "token budget spent" in ended_row
        assert not csp_violations(browser)
    finally:
        with site.db.session() as session:
            for campaign_id in ids:
                session.delete(session.get(CampaignRow, campaign_id))


def _paste(driver, field: str, text: str) -> None:
    """What pasting does: the whole text lands in the box at once."""
    box = driver.find_element(By.ID, field)
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));",
                          box, text)
    time.sleep(0.05)


def csp_violations(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def test_no_page_breaks_the_content_security_policy(site, browser):
    """Every page, its scripts (sorting, the chart's tooltip) and its bars work under the policy. A
    style attribute injected afterwards is blocked and reported, so an empty console means no page
    had one."""
    csp_violations(browser)  # drop what earlier tests left
    for path in ("/", f"/problems/{site.demo.problems[0]}", "/submit", "/status", "/login?next=/status",
                 "/problems/no-such-problem"):
        browser.get(site.url + path)
        wait(browser, lambda d: d.execute_script("return document.readyState") == "complete")
        assert browser.execute_script("return document.styleSheets.length") >= 1, path
        assert csp_violations(browser) == [], path
    browser.get(site.url + "/")
    browser.find_element(By.XPATH, "//table[@id='leaderboard']//th[normalize-space()='problem']").click()
    assert browser.find_element(By.XPATH, "//table[@id='leaderboard']//th[normalize-space()='problem']") \
        .get_attribute("aria-sort") == "ascending"  # table.js ran
    browser.execute_script("document.body.insertAdjacentHTML('beforeend', '<p id=\"injected\" style=\"color: "
                           "rgb(255, 0, 0)\">x</p>')")
    injected = browser.find_element(By.ID, "injected")
    assert injected.value_of_css_property("color") != "rgba(255, 0, 0, 1)"
    assert wait(browser, lambda d: csp_violations(d), 5)
