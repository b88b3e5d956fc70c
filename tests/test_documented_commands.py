"""Every `scrapy frontier ...` command line the README, docs/, the example project
and the CHANGELOG show goes through the command's real option parser: a user who
copies one never meets "unknown option" (issue 30: `domains --detail` was
documented and did not exist)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from scrapy.exceptions import UsageError
from scrapy.settings import Settings

from scrapy_reliability.commands.frontier import SUBCOMMANDS, FrontierCommand, check_arguments

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        REPO / "CHANGELOG.md",
        REPO / "example_project" / "README.md",
        *(REPO / "docs").rglob("*.md"),
    ]
)
# A command line in an inline code span or a line of a code block (not the name of a
# command quoted in a message, as in "(scrapy frontier move): ...").
_COMMAND = re.compile(r"scrapy frontier(?: [a-z|]+(?=[\s`]|$)[^`\n]*)?")
# Words of prose after a command (as in "`scrapy frontier migrate` ... or set X").
_PROSE_AFTER = re.compile(r"\s(?:\.\.\.|or|and|then|with)\s.*$")


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCUMENTS:
        for line in path.read_text(encoding="utf-8").splitlines():
            for match in _COMMAND.finditer(line):
                found.append((f"{path.relative_to(REPO)}", match.group(0)))
    return found


def _argument_lists(command: str) -> list[list[str]]:
    """The argument lists a documented command line stands for: its comment cut,
    ``[optional]`` brackets and ``...`` removed, ``a|b`` alternatives expanded."""
    text = command.split(" #", 1)[0]
    text = _PROSE_AFTER.sub("", text)
    text = text.replace("[", " ").replace("]", " ").replace("...", " ")
    words = shlex.split(text)[2:]  # without "scrapy frontier"
    if not words:
        return []  # the command named, not a command line
    choices = words[0].split("|")
    return [[choice, *words[1:]] for choice in choices]


def _parse(arguments: list[str]) -> None:
    command = FrontierCommand()
    command.settings = Settings()
    parser = argparse.ArgumentParser(prog="scrapy frontier", conflict_handler="resolve")
    command.add_options(parser)
    _opts, left = parser.parse_known_args(arguments)
    check_arguments(left)


def test_the_documents_show_frontier_commands() -> None:
    commands = documented_commands()
    # A regex that matched nothing would make the test below pass vacuously.
    assert len(commands) > 40
    shown = {lists[0][0] for _, c in commands if (lists := _argument_lists(c))}
    assert {"status", "domains", "dead", "move", "report"} <= shown


@pytest.mark.parametrize(("where", "command"), documented_commands())
def test_a_documented_frontier_command_parses(where: str, command: str) -> None:
    for arguments in _argument_lists(command):
        assert arguments[0] in SUBCOMMANDS, f"{where}: {command!r}: no such subcommand"
        try:
            _parse(arguments)
        except (UsageError, SystemExit) as exc:
            pytest.fail(f"{where}: {command!r} does not parse: {exc}")


def test_an_undocumented_option_is_refused_by_the_same_parse() -> None:
    with pytest.raises(UsageError, match="unknown option '--detail'"):
        _parse(["domains", "myspider", "--detail"])
    with pytest.raises(UsageError, match="expected a subcommand"):
        _parse(["domain", "myspider"])
