"""Submitting a problem: validation as the CLI does it, token or login, CSRF, size limits, and on
success the problem in the DB and campaigns with its reference check in a real Redis queue."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import redis
from sqlalchemy import select
from webseed import PROBLEMS, TOKEN

from kernelswarm.launcher import free_port
from services.web.submission import MAX_BYTES, reference_solution, validate
from shared.celery_app import EVALUATE
from shared.db import AttemptRow, CampaignProblemRow, ProblemRow, SolutionRow
from shared.errors import FormatError
from shared.repository import get_solution
from shared.schema import Language, load_problem

SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "sol-execbench-sample"
DEFINITION = {
    "name": "web_scale", "op_type": "elementwise", "hf_id": "example/model",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float32"}, "w": {"shape": ["n"], "dtype": "float32"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, w):\n    return x * w\n",
}
WORKLOAD = {"uuid": "w1", "axes": {"n": 1024}, "inputs": {"x": {"type": "random"}, "w": {"type": "random"}}}


def texts(definition=None, workloads=None) -> dict[str, str]:
    return {"definition": json.dumps(definition or DEFINITION),
            "workloads": "".join(json.dumps(w) + "\n" for w in (workloads or [WORKLOAD]))}


def csrf(client, path="/submit") -> str:
    html = client.get(path).get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def submit(client, fields: dict[str, str], token: str | None = TOKEN, **extra):
    data = {"csrf_token": csrf(client), **fields, **extra}
    if token is not None:
        data["token"] = token
    return client.post("/submit", data=data, content_type="multipart/form-data")


def field_errors(html: str, field: str) -> list[str]:
    block = re.search(rf'<ul class="errors" id="errors-{field}">(.*?)</ul>', html, re.S).group(1)
    return [re.sub(r"&#39;", "'", m) for m in re.findall(r"<li>(.*?)</li>", block, re.S)]


@pytest.fixture
def web(make_client, redis_url):
    return make_client(submit_token=TOKEN, redis_url=redis_url)


# --- validation: the CLI's own checks -----------------------------------------------------------------


BROKEN = {
    "invalid JSON": ("definition", {"definition": "{not json"}),
    "bad dtype": ("definition", texts({**DEFINITION, "inputs": {**DEFINITION["inputs"],
                                                                 "x": {"shape": ["n"], "dtype": "float33"}}})),
    "unknown field": ("definition", texts({**DEFINITION, "colour": "blue"})),
    "no run": ("definition", texts({**DEFINITION, "reference": "def main(x, w):\n    return x\n"})),
    "run signature": ("definition", texts({**DEFINITION, "reference": "def run(w, x):\n    return x * w\n"})),
    "unknown axis": ("workloads", texts(workloads=[WORKLOAD, {**WORKLOAD, "uuid": "w2", "axes": {"n": 4, "m": 2}}])),
    "missing input": ("workloads", texts(workloads=[{**WORKLOAD, "inputs": {"x": {"type": "random"}}}])),
    "duplicate uuid": ("workloads", texts(workloads=[WORKLOAD, WORKLOAD])),
    "bad workload JSON": ("workloads", {"workloads": json.dumps(WORKLOAD) + "\n{oops\n"}),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_messages_are_the_clis_beside_their_field(web, tmp_path, case):
    field, broken = BROKEN[case]
    fields = {**texts(), **broken}
    folder = tmp_path / "cli"
    folder.mkdir()
    (folder / "definition.json").write_text(fields["definition"])
    (folder / "workload.jsonl").write_text(fields["workloads"])
    with pytest.raises(FormatError) as cli:
        load_problem(folder, with_seeds=False)

    response = submit(web, fields)

    assert response.status_code == 400
    html = response.get_data(as_text=True)
    expected = str(cli.value).replace(f"{folder}/", "").splitlines()
    assert [re.sub("&quot;", '"', m) for m in field_errors(html, field)] == expected
    other = "workloads" if field == "definition" else "definition"
    assert field_errors(html, other) == []
    assert "kernelswarm-submit-" not in html and str(tmp_path) not in html  # no server paths
    assert fields["definition"][:20].replace('"', "&#34;") in html  # the text is kept for fixing


def test_our_problems_and_the_sol_execbench_sample_are_valid():
    folders = sorted(PROBLEMS.iterdir())
    if SAMPLE.is_dir():
        folders += sorted(p.parent for p in SAMPLE.rglob("definition.json"))
    checked = 0
    for folder in folders:
        workloads = (folder / "workload.jsonl").read_text()
        if '"safetensors"' in workloads:
            continue  # needs files beside the definition: the form says so (below)
        problem, cli = validate((folder / "definition.json").read_text(), workloads), load_problem(folder)
        assert (problem.definition, problem.workloads) == (cli.definition, cli.workloads)
        assert problem.root is None and problem.seeds == ()
        checked += 1
    assert checked >= 3


def test_what_a_form_cannot_carry_is_refused_beside_its_field(web):
    safetensors = {**WORKLOAD, "inputs": {"x": {"type": "safetensors", "path": "x.safetensors", "tensor_key": "x"},
                                          "w": {"type": "random"}}}
    html = submit(web, texts(workloads=[safetensors])).get_data(as_text=True)
    assert "safetensors inputs need files" in field_errors(html, "workloads")[0]

    html = submit(web, texts({**DEFINITION, "name": "../etc/passwd"})).get_data(as_text=True)
    assert "must be 1-128 letters" in field_errors(html, "definition")[0]


def test_empty_and_oversized_fields(web):
    html = submit(web, {"definition": " ", "workloads": ""}).get_data(as_text=True)
    assert field_errors(html, "definition") == ["definition.json is empty"]
    assert field_errors(html, "workloads") == ["workload.jsonl is empty"]

    padded = {**DEFINITION, "description": "x" * MAX_BYTES["definition"]}
    response = submit(web, texts(padded))
    assert response.status_code == 400
    assert field_errors(response.get_data(as_text=True), "definition") == ["definition.json is larger than 256 KiB"]


def test_a_request_over_the_limit_is_refused_whole(web):
    body = f"csrf_token={csrf(web)}&token={TOKEN}&workloads=y&definition=" + "x" * (3 * 1024 * 1024)
    response = web.post("/submit", data=body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413
    html = response.get_data(as_text=True)
    assert "<h1>Submission too large</h1>" in html and 'href="/submit">Back to the form' in html  # the site's page
    message = " ".join(re.search(r'<p class="error" id="too-large">(.*?)</p>', html, re.S).group(1).split())
    assert message == ("The submission is larger than the 2 MiB a request may carry (definition.json at most "
                       "256 KiB, workload.jsonl at most 1024 KiB), so the server stopped reading it at the limit "
                       "and has none of its text to show the form again with.")
    assert "x" * 100 not in html


def test_an_api_request_over_the_limit_is_a_json_413(web):
    body = json.dumps({"definition": "x" * (3 * 1024 * 1024), "workloads": ""})
    response = web.post("/api/problems", data=body, content_type="application/json",
                        headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 413 and response.mimetype == "application/json"
    assert response.get_json() == {"error": "the request is larger than 2 MiB: definition.json at most 256 KiB, "
                                            "workload.jsonl at most 1024 KiB", "status": 413}


def test_uploaded_files_win_over_the_text_boxes(web, db):
    fields = texts()
    data = {"csrf_token": csrf(web), "token": TOKEN, "definition": "ignored", "workloads": "ignored",
            "definition_file": (_bytes(fields["definition"]), "definition.json"),
            "workloads_file": (_bytes(fields["workloads"]), "workload.jsonl")}
    response = web.post("/submit", data=data, content_type="multipart/form-data")
    assert response.status_code == 200, response.get_data(as_text=True)
    with db.session() as session:
        assert session.scalar(select(ProblemRow.name)) == "web_scale"


def test_an_uploaded_file_that_is_not_text(web):
    data = {"csrf_token": csrf(web), "token": TOKEN, "workloads": texts()["workloads"],
            "definition_file": (_bytes(b"\xff\xfe\x00garbage"), "definition.json")}
    html = web.post("/submit", data=data, content_type="multipart/form-data").get_data(as_text=True)
    assert field_errors(html, "definition") == ["definition.json: not UTF-8 text"]


def _bytes(data):
    import io

    return io.BytesIO(data.encode() if isinstance(data, str) else data)


# --- who may submit ----------------------------------------------------------------------------------


def test_a_wrong_token_is_refused_beside_the_token_field(web, db):
    response = submit(web, texts(), token="wrong")

    assert response.status_code == 401
    assert field_errors(response.get_data(as_text=True), "token") == ["wrong or missing token"]
    with db.session() as session:
        assert session.scalar(select(ProblemRow.id)) is None


def test_without_csrf_token_nothing_happens(web, db):
    response = web.post("/submit", data={**texts(), "token": TOKEN}, content_type="multipart/form-data")
    assert response.status_code == 400
    assert "CSRF" in response.get_data(as_text=True)
    forged = web.post("/submit", data={**texts(), "token": TOKEN, "csrf_token": "forged"},
                      content_type="multipart/form-data")
    assert forged.status_code == 400
    with db.session() as session:
        assert session.scalar(select(ProblemRow.id)) is None


def test_without_a_configured_token_submitting_is_off(make_client):
    client = make_client()
    assert "Submitting is off" in client.get("/submit").get_data(as_text=True)
    assert submit(client, texts(), token="anything").status_code == 403
    response = client.post("/api/problems", json=texts(), headers={"Authorization": "Bearer anything"})
    assert response.status_code == 403 and response.get_json()["status"] == 403


def test_login_once_then_submit_without_the_token(web):
    response = web.post("/login", data={"csrf_token": csrf(web, "/login"), "token": TOKEN, "next": "/submit"})
    assert response.status_code == 302 and response.headers["Location"].endswith("/submit")
    assert 'id="field-token"' not in web.get("/submit").get_data(as_text=True)

    assert submit(web, texts(), token=None).status_code == 200

    web.post("/logout", data={"csrf_token": csrf(web)})
    assert submit(web, texts({**DEFINITION, "name": "web_scale_2"}), token=None).status_code == 401


def test_login_refuses_a_wrong_token_and_foreign_redirects(web):
    wrong = web.post("/login", data={"csrf_token": csrf(web, "/login"), "token": "nope"})
    assert wrong.status_code == 401 and "wrong or missing token" in wrong.get_data(as_text=True)
    away = web.post("/login", data={"csrf_token": csrf(web, "/login"), "token": TOKEN, "next": "//evil.example/x"})
    assert away.headers["Location"] == "/"


# --- on success ---------------------------------------------------------------------------------------


def queued(redis_url: str, queue: str) -> list[dict]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(m) for m in client.lrange(queue, 0, -1)]
    finally:
        client.close()


def task_args(message: dict) -> list:
    assert message["headers"]["task"] == EVALUATE
    return json.loads(base64.b64decode(message["body"]))[0]


def test_valid_problem_joins_the_campaigns_and_its_reference_is_queued(web, db, seed, store, redis_url):
    other = seed.problem("other")
    running = seed.campaign([other], name="running")
    paused = seed.campaign([other], name="paused", status="PAUSED", device="h200")
    stopped = seed.campaign([other], name="stopped", status="STOPPED")

    response = submit(web, texts())

    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert 'id="submitted"' in html and "is queued for the evaluator" in html
    with db.session() as session:
        problem = session.scalars(select(ProblemRow).where(ProblemRow.name == "web_scale")).one()
        assert problem.op_type == "elementwise" and problem.source_path is None
        joined = session.execute(select(CampaignProblemRow.campaign_id, CampaignProblemRow.position).where(
            CampaignProblemRow.problem_id == problem.id)).all()
        attempts = session.scalars(select(AttemptRow).where(AttemptRow.problem_id == problem.id)).all()
        solution_row = session.get(SolutionRow, attempts[0].solution_hash)
    assert sorted(joined) == [(running, 1), (paused, 1)]
    assert stopped not in {c for c, _ in joined}
    assert {(a.device, a.campaign_id, a.status) for a in attempts} == {("cpu", running, "PENDING"),
                                                                       ("h200", paused, "PENDING")}
    assert len({a.solution_hash for a in attempts}) == 1
    assert (solution_row.language, solution_row.author) == ("pytorch", "reference")
    solution = get_solution(store, attempts[0].solution_hash)
    assert solution.sources[0].content == DEFINITION["reference"]
    assert solution.spec.destination_passing_style is False
    by_device = {a.device: a.id for a in attempts}
    assert [task_args(m) for m in queued(redis_url, "evaluate")] == [[by_device["cpu"], "cpu"]]
    assert [task_args(m) for m in queued(redis_url, "evaluate.h200")] == [[by_device["h200"], "h200"]]
    assert "web_scale" in web.get("/").get_data(as_text=True)


def test_a_name_that_exists_is_refused(web, seed):
    seed.problem("web_scale")
    html = submit(web, texts()).get_data(as_text=True)
    assert "a problem named 'web_scale' exists" in field_errors(html, "definition")[0]


def test_without_a_running_campaign_the_reference_runs_on_the_default_device(web, db, redis_url):
    assert submit(web, texts()).status_code == 200
    with db.session() as session:
        attempt = session.scalars(select(AttemptRow)).one()
    assert (attempt.device, attempt.campaign_id) == ("cpu", None)
    assert [task_args(m) for m in queued(redis_url, "evaluate")] == [[attempt.id, "cpu"]]


def test_without_redis_the_problem_is_kept_and_the_check_waits(make_client, db):
    client = make_client(submit_token=TOKEN)
    html = submit(client, texts()).get_data(as_text=True)
    assert "is recorded but not queued" in html
    with db.session() as session:
        assert session.scalars(select(AttemptRow.status)).all() == ["PENDING"]


def test_with_redis_down_the_problem_is_kept_and_the_check_waits(make_client, db):
    client = make_client(submit_token=TOKEN, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    response = submit(client, texts())
    assert response.status_code == 200
    assert "is recorded but not queued" in response.get_data(as_text=True)


# --- the API ------------------------------------------------------------------------------------------


def test_api_submit(web, db, redis_url):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert web.post("/api/problems", json=texts()).status_code == 401
    assert web.post("/api/problems", json=texts(), headers={"Authorization": "Bearer nope"}).status_code == 401
    assert web.post("/api/problems", json={"definition": {}}, headers=headers).status_code == 400

    bad = web.post("/api/problems", json=texts({**DEFINITION, "colour": 1}), headers=headers)
    assert bad.status_code == 400
    assert bad.get_json()["fields"]["definition"] == [
        "definition.json: $.colour: Extra inputs are not permitted"]

    created = web.post("/api/problems", json=texts(), headers=headers)
    assert created.status_code == 201
    body = created.get_json()
    assert body["name"] == "web_scale" and body["queued"] is True and body["url"] == "/problems/web_scale"
    assert [task_args(m) for m in queued(redis_url, "evaluate")] == [[body["attempt_ids"][0], "cpu"]]


# --- the reference check itself -----------------------------------------------------------------------


def test_the_reference_passes_as_a_pytorch_solution_in_the_sandbox(tmp_path):
    from services.evaluator.config import EvalConfig
    from services.evaluator.evaluate import evaluate

    problem = load_problem(PROBLEMS / "llama31_8b_rmsnorm", with_seeds=False)
    solution = reference_solution(problem)
    assert solution.spec.language is Language.PYTORCH
    config = EvalConfig(device="cpu", correctness_rounds=1, timing_sets=1, warmup_runs=1, timing_runs=3,
                        timing_budget_s=0.2, attempt_timeout_s=120, scratch_dir=tmp_path)

    result = evaluate(problem, solution, config, max_workloads=2)

    assert result.status.value == "PASSED", result.message


def test_submissions_beyond_the_hourly_limit_get_429_and_store_nothing(make_client, redis_url, db):
    web = make_client(submit_token=TOKEN, redis_url=redis_url, submit_limit_per_hour=2)
    for n in range(2):
        ok = submit(web, texts({**DEFINITION, "name": f"limited_{n}"}))
        assert ok.status_code == 200, ok.get_data(as_text=True)[-2000:]
    refused = submit(web, texts({**DEFINITION, "name": "limited_2"}))
    assert refused.status_code == 429
    assert any("too many submissions: 2 problems in the last hour (the limit is 2)" in m
               for m in field_errors(refused.get_data(as_text=True), "definition"))
    api = web.post("/api/problems", json=texts({**DEFINITION, "name": "limited_3"}),
                   headers={"Authorization": f"Bearer {TOKEN}"})
    assert api.status_code == 429 and "too many submissions" in api.get_json()["error"]
    with db.session() as session:
        names = set(session.scalars(select(ProblemRow.name)))
    assert {"limited_0", "limited_1"} <= names and not {"limited_2", "limited_3"} & names


def test_a_workload_over_the_size_budget_is_refused_naming_its_tensors(make_client, redis_url):
    """The setting's budget (issue 25): the form keeps the text and names the tensors and their bytes;
    the API answers 400 with the same message under `workloads`."""
    client = make_client(submit_token=TOKEN, redis_url=redis_url, max_workload_bytes=1 << 20)
    big = texts(workloads=[{**WORKLOAD, "axes": {"n": 1 << 20}}])
    response = submit(client, big)
    assert response.status_code == 400
    [message] = field_errors(response.get_data(as_text=True), "workloads")
    assert "workload 1 (w1): its tensors take 12,582,912 bytes (0.01 GiB), over the budget of 1,048,576 bytes" \
           in message
    assert "`x` 4,194,304 bytes" in message and "`w` 4,194,304 bytes" in message and "`y` 4,194,304 bytes" in message
    api = client.post("/api/problems", json=big, headers={"Authorization": f"Bearer {TOKEN}"})
    assert api.status_code == 400 and "over the budget" in api.get_json()["fields"]["workloads"][0]
    assert submit(client, texts()).status_code in (200, 201, 302)  # a small one still goes in
