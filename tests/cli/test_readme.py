"""The README's account of `kernelswarm up` agrees with the code it describes."""

from __future__ import annotations

from pathlib import Path

from services.planner.campaign import create_campaign
from services.planner.policy import DEFAULT_POLICY, ROUND_ROBIN

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_names_the_policy_that_ups_campaign_runs():
    text = README.read_text()
    paragraph = " ".join(text[text.index("What happens during `up`"):].split("\n\n", 1)[0].split())
    assert create_campaign.__kwdefaults__["policy"] == DEFAULT_POLICY  # `up` passes no policy
    assert f"the planner assigns problems by its default policy, `{DEFAULT_POLICY}`" in paragraph
    assert "round-robin" not in paragraph and ROUND_ROBIN not in paragraph


def test_the_readme_shows_how_to_submit_and_how_to_start_afresh():
    from kernelswarm.cli import build_parser
    from kernelswarm.up import IDLE_HELP

    text = " ".join(README.read_text().split())
    assert "export KERNELSWARM_SUBMIT_TOKEN=$(.venv/bin/kernelswarm token)" in text
    assert "`kernelswarm up --new`" in text and "`kernelswarm reset`" in text and "continuing campaign 1" in text
    commands = build_parser()._subparsers._group_actions[0].choices
    assert "reset" in commands and "--new" in commands["up"].format_help()
    assert "kernelswarm reset" in IDLE_HELP and "KERNELSWARM_SUBMIT_TOKEN" in IDLE_HELP
