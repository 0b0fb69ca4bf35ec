"""The problem page, its JSON, and the solution and traces downloads."""

from __future__ import annotations

import json
import re

import pytest

from services.web.charts import history_svg
from services.web.problem_data import History, HistoryPoint
from shared.db.models import AttemptRow
from shared.repository import put_solution
from shared.schema import Solution, Trace, load_problem
from webseed import PROBLEMS, T0

RMSNORM = "llama31_8b_rmsnorm"


@pytest.fixture
def rmsnorm(seed, store, db):
    """The real rmsnorm problem with a failed, a slower and a best attempt; the best has its
    solution (the problem's seed solution) and traces in the store and a traces row per workload."""
    problem = load_problem(PROBLEMS / RMSNORM)
    problem_id = seed.real_problem(RMSNORM)
    with db.session() as session:
        parent = put_solution(session, store, problem_id, problem.seed("pytorch").model_copy(update={"name": "parent"}))
        best_hash = put_solution(session, store, problem_id, problem.seed("pytorch"), parent_hash=parent)
    traces = [Trace.model_validate({
        "definition": RMSNORM, "workload": w.model_dump(exclude_unset=True), "solution": problem.seed("pytorch").name,
        "evaluation": {"status": "PASSED", "environment": {"hardware": "CPU"}, "timestamp": "2026-01-01T12:03:00Z",
                       "correctness": {}, "performance": {"latency_ms": 0.5, "reference_latency_ms": 1.0,
                                                          "speedup_factor": 2.0}}}) for w in problem.workloads]
    traces_hash = store.put("".join(t.model_dump_json(exclude_none=True) + "\n" for t in traces).encode())
    failed = seed.attempt(problem_id, "COMPILE_ERROR", minute=1, message="main.cu(3): error: expected ';'")
    slower = seed.attempt(problem_id, "PASSED", speedup=1.2, latency_ms=0.8, sol_score=0.55, minute=2,
                          solution_hash=parent)
    best = seed.attempt(problem_id, "PASSED", speedup=2.0, latency_ms=0.5, sol_score=0.7, minute=3,
                        solution_hash=best_hash, traces_hash=traces_hash, model="gpt-oss-120b")
    for i, workload in enumerate(problem.workloads):
        seed.trace(best, workload.uuid, latency_ms=0.5, reference_latency_ms=1.0, t_sol_ms=0.1 * (i + 1),
                   t_baseline_ms=0.9, sol_score=0.7)
    pending = seed.attempt(problem_id, "PENDING", minute=4)
    return {"problem": problem, "failed": failed, "slower": slower, "best": best, "pending": pending,
            "best_hash": best_hash, "traces_hash": traces_hash}


def test_page_shows_every_section(client, rmsnorm):
    response = client.get(f"/problems/{RMSNORM}")

    assert response.status_code == 200
    html = response.get_data(as_text=True)
    for heading in ("Best", "History: SOL score", "Per workload (best attempt)", "Best solution", "Attempts",
                    "Definition", "Reference", "Workloads", "Traces (best attempt, JSONL)"):
        assert f">{heading}<" in html
    assert '<div class="hl"><pre>' in html  # highlighted reference and source
    assert '<span class="k">def</span><span class="w"> </span><span class="nf">run</span>' in html
    assert "meta-llama/Llama-3.1-8B" in html
    assert "download solution.json" in html and "download traces.jsonl" in html
    assert "main.cu(3): error: expected &#39;;&#39;" in html
    assert html.count('<tr id="attempt-') == 4  # every attempt, the pending one too
    for workload in rmsnorm["problem"].workloads:
        assert workload.uuid[:8] in html
    assert "num_tokens=1024" in html
    assert "0.7000" not in html and "0.700" in html  # SOL score with three digits


def test_the_model_column_shows_the_model_or_a_dash_and_the_author_has_its_own(client, rmsnorm):
    html = client.get(f"/problems/{RMSNORM}").get_data(as_text=True)

    def cells(attempt_id: str) -> list[str]:
        row = re.search(rf'<tr id="attempt-{attempt_id}">(.*?)</tr>', html, re.S).group(1)
        return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]

    model, author = 8, 9  # attempt, finished, status, latency, speedup, SOL, language, parent, model, author
    assert (cells(rmsnorm["best"])[model], cells(rmsnorm["best"])[author]) == ("gpt-oss-120b", "kernelswarm-seed")
    assert (cells(rmsnorm["failed"])[model], cells(rmsnorm["failed"])[author]) == ("—", "writer-1")


def test_chart_draws_each_finished_attempt_and_names_it(client, rmsnorm):
    html = client.get(f"/problems/{RMSNORM}").get_data(as_text=True)
    svg = html[html.index('<svg class="history"'):html.index("</svg>")]

    assert svg.count('class="pt pt-pass"') == 2
    assert svg.count('class="pt pt-fail"') == 1
    assert rmsnorm["pending"] not in svg
    for key in ("failed", "slower", "best"):
        assert f'data-attempt="{rmsnorm[key]}"' in svg
        assert f'href="#attempt-{rmsnorm[key]}"' in svg
    assert f"<title>attempt {rmsnorm['best'][:8]} · PASSED 0.700 · 2026-01-01 12:03:00</title>" in svg
    assert svg.count('<path class="best"') == 1
    assert "baseline T_b" in svg and "hardware limit" in svg


def test_api_problem_has_what_the_page_shows(client, rmsnorm):
    body = client.get(f"/api/problems/{RMSNORM}").get_json()

    assert set(body) == {"name", "op_type", "description", "definition", "workloads", "best", "history", "attempts",
                         "per_workload"}
    assert body["definition"]["name"] == RMSNORM and "def run" in body["definition"]["reference"]
    assert len(body["workloads"]) == len(rmsnorm["problem"].workloads)
    assert body["best"]["id"] == rmsnorm["best"]
    assert body["best"]["parent_hash"] is not None and body["best"]["model"] == "gpt-oss-120b"
    assert body["history"]["metric"] == "sol_score" and body["history"]["total_attempts"] == 3
    assert [p["best_so_far"] for p in body["history"]["points"]] == [None, 0.55, 0.7]
    assert [a["status"] for a in body["attempts"]] == ["PENDING", "PASSED", "PASSED", "COMPILE_ERROR"]
    assert [w["workload_uuid"] for w in body["per_workload"]] == [w.uuid for w in rmsnorm["problem"].workloads]
    assert body["per_workload"][0]["axes"] == {"num_tokens": 1}
    assert body["per_workload"][1]["t_sol_ms"] == pytest.approx(0.2)


def test_each_latency_has_its_interval_and_a_speedup_inside_the_noise_is_about_one(client, seed):
    problem = seed.problem("noisy")
    best = seed.attempt(problem, "PASSED", speedup=1.4, sol_score=0.6, minute=1)
    seed.trace(best, "clear", latency_ms=0.5, reference_latency_ms=1.0, intervals=(0.48, 0.52, 0.95, 1.1))
    seed.trace(best, "noise", latency_ms=1.0, reference_latency_ms=1.05, intervals=(0.9, 1.2, 0.98, 1.3))
    seed.trace(best, "plain", latency_ms=1.0, reference_latency_ms=2.0)  # timed before intervals were kept

    by_uuid = {w["workload_uuid"]: w for w in client.get("/api/problems/noisy").get_json()["per_workload"]}
    assert by_uuid["clear"]["speedup_clear"] is True and by_uuid["noise"]["speedup_clear"] is False
    assert (by_uuid["clear"]["latency_q1_ms"], by_uuid["clear"]["reference_q3_ms"]) == (0.48, 1.1)
    assert by_uuid["plain"]["speedup_clear"] is None and by_uuid["plain"]["latency_q1_ms"] is None
    assert {w["attempts"] for w in by_uuid.values()} == {1}  # one attempt: its own figures, as they were
    assert by_uuid["clear"]["latency_ms"] == 0.5 and by_uuid["clear"]["speedup"] == 2.0

    html = client.get("/problems/noisy").get_data(as_text=True)
    table = html[html.index('id="workload-results"'):]
    table = table[:table.index("</table>")]
    rows = {uuid: re.search(rf"<tr><td class=\"name\">{uuid}</td>.*?</tr>", table, re.DOTALL).group(0)
            for uuid in by_uuid}
    assert "[0.4800–0.5200]" in rows["clear"] and "2.00x" in rows["clear"]
    assert "≈1x" in rows["noise"] and "1.05x" in rows["noise"]  # the measured figure in its title only
    assert "≈1x" not in rows["plain"] and "2.00x" in rows["plain"] and "interval" not in rows["plain"]
    assert "over-attempts" not in html and " attempts</span>" not in table


H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def repeated(seed, db):
    """One solution PASSED in three verdict attempts on one H100, its workloads' intervals differing
    from one to the next; around them, attempts that must not count: the same solution on another
    hardware and another device, a profile run of it, a failed run of it, and another solution."""
    problem = seed.problem("repeated")
    # workload: (latency, q1, q3, reference, rq1, rq3) for the best attempt, then its two repeats
    timings = {"apart": [(0.50, 0.48, 0.52, 1.00, 0.95, 1.05), (0.55, 0.53, 0.60, 1.02, 0.99, 1.08),
                         (0.52, 0.45, 0.54, 0.98, 0.90, 1.01)],
               "close": [(0.80, 0.78, 0.82, 0.90, 0.88, 0.92), (0.86, 0.84, 0.89, 0.95, 0.93, 0.97),
                         (0.84, 0.83, 0.85, 0.90, 0.89, 0.91)]}  # each attempt clear alone, not over all three
    best = seed.attempt(problem, "PASSED", speedup=1.5, sol_score=0.7, minute=1, device="h100", hardware=H100)
    with db.session() as session:
        solution = session.get(AttemptRow, best).solution_hash
    same = {"solution_hash": solution, "device": "h100", "hardware": H100}
    repeats = [seed.attempt(problem, "PASSED", speedup=1.4, sol_score=0.6, minute=2 + i, **same) for i in range(2)]
    for i, attempt in enumerate([best, *repeats]):
        for uuid, rows in timings.items():
            latency, q1, q3, reference, rq1, rq3 = rows[i]
            seed.trace(attempt, uuid, latency_ms=latency, reference_latency_ms=reference,
                       intervals=(q1, q3, rq1, rq3), t_sol_ms=0.1, sol_score=0.7 - i / 10)
    wide = (0.01, 9.0, 0.02, 9.5)  # an interval that would show wherever it was combined
    others = [seed.attempt(problem, "PASSED", sol_score=0.5, minute=5, **(same | {"hardware": "NVIDIA H200"})),
              seed.attempt(problem, "PASSED", sol_score=0.5, minute=6, **(same | {"device": "h200"})),
              seed.attempt(problem, "PASSED", sol_score=0.5, minute=7, kind="profile", **same),
              seed.attempt(problem, "RUNTIME_ERROR", minute=8, **same),
              seed.attempt(problem, "PASSED", sol_score=0.5, minute=9, device="h100", hardware=H100)]
    for attempt in others:
        for uuid in timings:
            seed.trace(attempt, uuid, latency_ms=1.0, reference_latency_ms=1.0, intervals=wide)
    return {"best": best, "repeats": repeats}


def test_a_solution_passed_in_several_attempts_shows_its_spread_over_them(client, repeated):
    body = client.get("/api/problems/repeated").get_json()
    assert body["best"]["id"] == repeated["best"]
    by_uuid = {w["workload_uuid"]: w for w in body["per_workload"]}
    apart, close = by_uuid["apart"], by_uuid["close"]

    assert apart["attempts"] == close["attempts"] == 3  # neither another hardware, device, kind nor solution
    assert (apart["latency_ms"], apart["latency_q1_ms"], apart["latency_q3_ms"]) == (0.52, 0.45, 0.60)
    assert (apart["reference_latency_ms"], apart["reference_q1_ms"], apart["reference_q3_ms"]) == (1.00, 0.90, 1.08)
    assert apart["speedup"] == pytest.approx(1.00 / 0.52) and apart["speedup_clear"] is True
    assert (close["latency_q1_ms"], close["latency_q3_ms"], close["reference_q1_ms"]) == (0.78, 0.89, 0.88)
    assert close["speedup_clear"] is False  # clear in each attempt, inside the noise over the three
    assert (apart["t_sol_ms"], apart["sol_score"]) == (0.1, 0.7)  # the best attempt's own, as it was ranked

    html = client.get("/problems/repeated").get_data(as_text=True)
    table = html[html.index('id="workload-results"'):]
    table = table[:table.index("</table>")]
    rows = {uuid: re.search(rf"<tr><td class=\"name\">{uuid}</td>.*?</tr>", table, re.DOTALL).group(0)
            for uuid in by_uuid}
    assert "[0.4500–0.6000]" in rows["apart"] and "over 3 attempts" in rows["apart"] and "1.92x" in rows["apart"]
    assert "≈1x" in rows["close"] and "over 3 attempts" in rows["close"]
    assert 'id="over-attempts"' in html and "passed in 3 attempts" in html


def test_one_attempts_own_figures_are_not_combined(client, repeated):
    body = client.get(f"/api/attempts/{repeated['best']}").get_json()
    apart = {w["workload_uuid"]: w for w in body["per_workload"]}["apart"]
    assert apart["attempts"] == 1
    assert (apart["latency_ms"], apart["latency_q1_ms"], apart["latency_q3_ms"]) == (0.5, 0.48, 0.52)


def test_solution_download_is_the_stored_solution(client, rmsnorm):
    response = client.get(f"/problems/{RMSNORM}/solution.json")

    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert "attachment" in response.headers["Content-Disposition"]
    solution = Solution.model_validate_json(response.data)
    assert solution.content_hash() == rmsnorm["best_hash"]
    assert client.get(f"/api/attempts/{rmsnorm['best']}/solution.json").data == response.data


def test_traces_download_is_the_stored_jsonl(client, rmsnorm, store):
    response = client.get(f"/problems/{RMSNORM}/traces.jsonl")

    assert response.status_code == 200
    assert response.data == store.get(rmsnorm["traces_hash"])
    traces = [Trace.model_validate_json(line) for line in response.data.splitlines()]
    assert len(traces) == len(rmsnorm["problem"].workloads)
    assert client.get(f"/api/attempts/{rmsnorm['best']}/traces.jsonl").data == response.data


def test_api_attempt(client, rmsnorm):
    body = client.get(f"/api/attempts/{rmsnorm['best']}").get_json()

    assert body["problem"] == RMSNORM
    assert body["attempt"]["sol_score"] == 0.7
    assert len(body["per_workload"]) == len(rmsnorm["problem"].workloads)
    assert client.get(f"/api/attempts/{rmsnorm['failed']}/traces.jsonl").status_code == 404


def test_problem_without_passed_attempts(client, seed):
    problem_id = seed.real_problem("llama31_8b_swiglu")
    seed.attempt(problem_id, "RUNTIME_ERROR", message="boom")

    html = client.get("/problems/llama31_8b_swiglu").get_data(as_text=True)
    assert "No PASSED attempt yet." in html and "History: speedup over the reference" in html
    assert client.get("/problems/llama31_8b_swiglu/solution.json").status_code == 404
    api = client.get("/api/problems/llama31_8b_swiglu").get_json()
    assert api["best"] is None and api["per_workload"] == []


def test_best_solution_missing_from_the_store_is_a_note_not_an_error(client, seed):
    problem_id = seed.real_problem(RMSNORM)
    seed.attempt(problem_id, "PASSED", speedup=1.0, latency_ms=1.0)  # its solution was never stored

    response = client.get(f"/problems/{RMSNORM}")
    assert response.status_code == 200
    assert "sources cannot be read" in response.get_data(as_text=True)


@pytest.mark.parametrize("path", ["/problems/nope", "/api/problems/nope", "/api/attempts/nope",
                                  "/problems/nope/solution.json"])
def test_unknown_is_404(client, path):
    response = client.get(path)

    assert response.status_code == 404
    if path.startswith("/api/"):
        assert response.get_json()["status"] == 404


def test_problem_names_are_escaped(client, seed):
    seed.problem("<script>x</script>")
    html = client.get("/").get_data(as_text=True)
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html


def test_chart_of_speedups_marks_the_reference_and_steps_up_only():
    points = [HistoryPoint(attempt_id=f"a{i}", at=T0.replace(minute=i), status=status, value=value, best_so_far=best)
              for i, (status, value, best) in enumerate([("PASSED", 1.5, 1.5), ("TIMEOUT", None, 1.5),
                                                         ("PASSED", 1.2, 1.5), ("PASSED", 3.0, 3.0)])]
    svg = str(history_svg(History(metric="speedup", total_attempts=4, points=points), "speedup"))

    assert svg.count('class="pt pt-pass"') == 3 and svg.count('class="pt pt-fail"') == 1
    assert ">reference<" in svg and "hardware limit" not in svg
    step = re.search(r'<path class="best" d="([^"]+)"', svg).group(1)
    assert step.startswith("M") and step.count("V") == 1  # one improvement after the first
    assert json.dumps("a3")[1:-1] in svg


def test_chart_draws_partial_attempts_with_a_marker_of_their_own_named_in_the_legend():
    """A PARTIAL attempt (a rung of the tuner's successive halving) is no failure: a diamond, not a cross."""
    points = [HistoryPoint(attempt_id=f"a{i}", at=T0.replace(minute=i), status=status, value=value, best_so_far=best)
              for i, (status, value, best) in enumerate([("PARTIAL", None, None), ("COMPILE_ERROR", None, None),
                                                         ("PASSED", 0.6, 0.6), ("PARTIAL", None, 0.6)])]
    svg = str(history_svg(History(metric="sol_score", total_attempts=4, points=points), "SOL score"))

    assert svg.count('class="pt pt-partial"') == 2 and svg.count('class="pt pt-fail"') == 1
    assert re.search(r'<path class="pt pt-partial"[^>]*data-attempt="a0"><title>attempt a0 · PARTIAL', svg)
    legend = svg[svg.index('<g class="legend">'):svg.index("</g>")]
    for kind, meaning in (("pass", "passed"), ("partial", "partial: passed the workloads it ran, not all"),
                          ("fail", "failed"), ("best", "best so far")):
        assert f'class="key key-{kind}"' in legend and f">{meaning}" in legend


def test_chart_without_attempts():
    assert "No finished attempts yet" in str(history_svg(History(metric="speedup", total_attempts=0, points=[]), "x"))
