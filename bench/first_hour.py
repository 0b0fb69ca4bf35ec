"""A new user's first hour, replayed: a fresh clone's `make run` for a while (a problem submitted
through the API on the way), Ctrl-C, then `make run` again. Writes the console of both runs with the
time of each line, screenshots of the site at each step (headless Chromium), and a JSON summary.

    python bench/first_hour.py --minutes 20 --again-minutes 4 --out docs/results/first-hour

With `--again-with-scripted-llm` the second run has an LLM writer: OPENAI_BASE_URL points at a
scripted OpenAI-compatible server of this script's (no model behind it), whose every session
evaluates the problem's own reference as a `pytorch` solution, then submits. It shows what the
continuous campaign does when a writer that can do more arrives: the problems the tuner exhausted,
the submitted one included, get writers again.

Needs git, make, chromium and chromedriver (Debian's), and Python with selenium (`make setup`'s
virtualenv has it). Everything runs in a clone under --workdir; nothing of this checkout is used
but its committed files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBLEM = {
    "name": "first_hour_scale_add", "op_type": "elementwise",
    "description": "y = x * w + b, submitted through the API by bench/first_hour.py.",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"},
               "b": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, w, b):\n    return x * w + b\n",
}
WORKLOADS = [{"uuid": f"n{n}", "axes": {"n": n},
              "inputs": {"x": {"type": "random"}, "w": {"type": "random"}, "b": {"type": "random"}}}
             for n in (4096, 1 << 20)]


class Run:
    """`make run` in the clone, its console (stdout and stderr together) kept with each line's time."""

    def __init__(self, clone: Path, env: dict[str, str], log: Path, label: str) -> None:
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.log = log.open("a")
        self.log.write(f"===== {label}: `make run` in a fresh clone ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})\n")
        self.process = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                        preexec_fn=interactive_sigint)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            at = time.monotonic() - self.started
            self.lines.append((at, line.rstrip("\n")))
            self.log.write(f"[{at:7.1f}] {line}")
            self.log.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def seen(self, pattern: str) -> float | None:
        return next((at for at, line in self.lines if re.search(pattern, line)), None)

    def ctrl_c(self, wait_s: float = 120) -> int:
        """SIGINT to the foreground group, as a terminal's Ctrl-C sends it."""
        self.log.write(f"[{self.elapsed():7.1f}] ----- Ctrl-C\n")
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            code = self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        self.reader.join(timeout=10)
        self.log.write(f"[{self.elapsed():7.1f}] ----- exit code {code}\n")
        self.log.close()
        return code


def interactive_sigint() -> None:
    """SIGINT as a terminal's shell leaves it (default), not as a background job's (ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ScriptedWriter:
    """A stand-in for an LLM endpoint: a request that ends with a tool's answer gets `submit`; any
    other gets `evaluate` with the problem's reference (read from the brief) as a `pytorch` solution.
    Answers whole JSON replies (the client falls back from streaming once)."""

    def __init__(self) -> None:
        from werkzeug.serving import make_server

        self.requests = 0
        self.server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _app(self, environ, start_response):
        from werkzeug.wrappers import Request, Response

        body = json.loads(Request(environ).get_data())
        self.requests += 1
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            call = {"name": "submit", "arguments": "{}"}
        else:
            brief = next(m["content"] for m in messages if m["role"] == "user")
            found = re.search(r"## Reference\n```python\n(.*?)```", brief, re.DOTALL)
            call = {"name": "evaluate", "arguments": json.dumps({
                "language": "pytorch", "entry_point": "main.py::run", "destination_passing_style": False,
                "files": [{"path": "main.py", "content": found.group(1) if found else "def run():\n    pass\n"}]})}
        reply = {"id": f"s{self.requests}", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                     "role": "assistant", "content": None,
                     "tool_calls": [{"id": f"call_{self.requests}", "type": "function", "function": call}]}}],
                 "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}}
        return Response(json.dumps(reply), content_type="application/json")(environ, start_response)

    def close(self) -> None:
        self.server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, token: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5):
            return True
    except OSError:
        return False


class Browser:
    def __init__(self, shots: Path, width: int = 1280) -> None:
        from selenium import webdriver

        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},1000"):
            options.add_argument(flag)
        service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
        self.driver, self.shots, self.width = webdriver.Chrome(options=options, service=service), shots, width
        self.taken: list[str] = []

    def shot(self, url: str, name: str) -> None:
        self.driver.get(url)
        time.sleep(1.0)  # the charts' script
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(self.width, min(height, 4000))
        self.driver.save_screenshot(str(self.shots / f"{name}.png"))
        self.driver.set_window_size(self.width, 1000)
        self.taken.append(name)

    def close(self) -> None:
        self.driver.quit()


def leaderboard(url: str) -> dict:
    return get_json(f"{url}/api/leaderboard")[1]


def problem_attempts(url: str, name: str) -> list[dict]:
    status, body = get_json(f"{url}/api/problems/{name}")
    return body.get("attempts", []) if status == 200 else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="the first run's length (default 20)")
    parser.add_argument("--again-minutes", type=float, default=4.0, help="the second run's length (default 4)")
    parser.add_argument("--submit-after-s", type=float, default=180.0, help="when the problem is submitted")
    parser.add_argument("--again-with-scripted-llm", action="store_true",
                        help="the second run's writers talk to a scripted OpenAI-compatible server (see above)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kernelswarm-first-hour"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "first-hour")
    args = parser.parse_args()

    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    args.workdir.mkdir(parents=True)
    clone = args.workdir / "kernelswarm"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    shots = args.out / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    console = args.out / "console.txt"
    console.write_text("")
    token, port = secrets.token_urlsafe(32), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELSWARM_", "OPENAI_", "VIRTUAL_ENV"))}
    env |= {"KERNELSWARM_SUBMIT_TOKEN": token, "KERNELSWARM_WEB_PORT": str(port)}
    summary: dict = {"commit": commit, "port": port, "minutes": args.minutes, "again_minutes": args.again_minutes,
                     "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": f"{os.cpu_count()} cores"}
    browser = None

    first = Run(clone, env, console, "first run")
    try:
        while not answers(url):
            if first.process.poll() is not None:
                raise SystemExit(f"`make run` ended with {first.process.returncode} before the site answered")
            time.sleep(2)
        summary["site_answers_s"] = round(first.elapsed(), 1)
        print(f"[{first.elapsed():6.0f} s] the site answers at {url}", flush=True)
        browser = Browser(shots)
        browser.shot(url + "/", "1-leaderboard-first-answer")
        submitted = passed_shot = idle_shot = False
        while first.elapsed() < args.minutes * 60:
            if first.process.poll() is not None:
                raise SystemExit(f"`make run` ended by itself with {first.process.returncode}")
            board = leaderboard(url)
            if not passed_shot and any(p.get("passed_attempts") for p in board.get("problems", [])):
                passed_shot = True
                summary["first_passed_s"] = round(first.elapsed(), 1)
                browser.shot(url + "/", "2-leaderboard-first-passed")
            if not submitted and first.elapsed() >= args.submit_after_s:
                submitted = True
                code, body = get_json(f"{url}/api/problems", token, {
                    "definition": json.dumps(PROBLEM), "workloads": "\n".join(json.dumps(w) for w in WORKLOADS)})
                summary["submit"] = {"at_s": round(first.elapsed(), 1), "status": code, "response": body}
                first.log.write(f"[{first.elapsed():7.1f}] ----- POST /api/problems: {code} {json.dumps(body)}\n")
            if not idle_shot and first.seen(r"idle: every problem retired"):
                idle_shot = True
                summary["idle_s"] = round(first.seen(r"idle: every problem retired"), 1)
                browser.shot(url + "/status", "3-status-idle")
            time.sleep(10)
        summary["submitted_attempts"] = [(a["status"], a.get("author"), a.get("model"))
                                         for a in problem_attempts(url, PROBLEM["name"])]
        browser.shot(url + "/", "4-leaderboard-before-ctrl-c")
        browser.shot(url + f"/problems/{PROBLEM['name']}", "5-submitted-problem")
        browser.shot(url + "/status", "6-status-before-ctrl-c")
        summary["first_board"] = leaderboard(url).get("summary")
    finally:
        summary["first_exit"] = first.ctrl_c()

    writer = None
    if args.again_with_scripted_llm:
        writer = ScriptedWriter()
        env = env | {"OPENAI_API_KEY": "sk-scripted", "OPENAI_BASE_URL": writer.url,
                     "KERNELSWARM_MODEL": "scripted-reference-writer"}
    again = Run(clone, env, console, "second run" + (" (a scripted LLM writer)" if writer else ""))
    try:
        while not answers(url) and again.process.poll() is None:
            time.sleep(2)
        summary["again_site_answers_s"] = round(again.elapsed(), 1)
        browser.shot(url + "/status", "7-status-second-run")
        while again.elapsed() < args.again_minutes * 60 and again.process.poll() is None:
            time.sleep(10)
        browser.shot(url + "/", "8-leaderboard-second-run")
        browser.shot(url + f"/problems/{PROBLEM['name']}", "9-submitted-problem-second-run")
        summary["again_board"] = leaderboard(url).get("summary")
        summary["submitted_attempts_after_second_run"] = [
            (a["status"], a.get("author"), a.get("model")) for a in problem_attempts(url, PROBLEM["name"])]
    finally:
        summary["again_exit"] = again.ctrl_c()
        if writer is not None:
            summary["scripted_writer_requests"] = writer.requests
            writer.close()
        if browser is not None:
            summary["screenshots"] = browser.taken
            browser.close()
    for key, run in (("first_said", first), ("again_said", again)):
        summary[key] = [line for _, line in run.lines
                        if re.search(r"campaign \d+|continuing|idle|leaving out|stopping|Ctrl-C", line)][:40]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps({k: summary[k] for k in ("site_answers_s", "first_passed_s", "idle_s", "first_exit",
                                               "again_exit") if k in summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
