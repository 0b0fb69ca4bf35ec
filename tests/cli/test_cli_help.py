"""`kernelswarm --help` and every subcommand's: each subcommand says what it does, each of its
arguments what it takes."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from kernelswarm.cli import build_parser, main


def commands(parser: argparse.ArgumentParser,
             path: str = "kernelswarm") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the tree, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def test_every_argument_of_every_command_has_a_help_text():
    tree = list(commands(build_parser()))
    assert len(tree) > 10
    undocumented = [f"{path} {'/'.join(action.option_strings) or action.dest}" for path, parser in tree
                    for action in parser._actions
                    if not isinstance(action, argparse._SubParsersAction)
                    and not (action.help and action.help.strip() and action.help != argparse.SUPPRESS)]
    assert undocumented == []


def test_every_subcommand_has_a_description():
    described = {path: parser.description for path, parser in commands(build_parser())}
    assert [path for path, description in described.items() if not description] == []


@pytest.mark.parametrize("words", [["up"], ["campaign", "create"], ["problems", "validate"], ["leaderboard"]])
def test_a_subcommands_help_shows_its_description_options_and_example(words, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*words, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: kernelswarm {' '.join(words)}")
    assert "\nexample:\n  kernelswarm " in text
