"""Every ``gcloud`` command the docs print parses with gcloud's own parser (the Google Cloud CLI on
PATH), so a reader who pastes one meets Google's answer, never a misspelt flag.

Each runs with a configuration of its own, its project set (as a reader's is) and no account: a
command gcloud parses stops at its first call to Google ("You do not currently have an active
account selected"), one it cannot parse exits with 2 naming the argument. Emulator commands are
left out: running one starts an emulator (the suite starts both its own way,
devtools/emulator.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.gcloud import PARSED, parse

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("**/README.md"))]
FENCE = re.compile(r"^[ \t]*```[a-z]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)  # a list item's too


def gcloud_commands(text: str) -> list[str]:
    """The ``gcloud`` commands of a page's fenced blocks, continuation lines joined."""
    found = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.strip().removeprefix("$ ")
            if command.startswith("gcloud ") and " emulators " not in command:
                found.append(command)
    return found


COMMANDS = [
    pytest.param(command, id=f"{page.relative_to(ROOT)}:{index}")
    for page in PAGES
    for index, command in enumerate(gcloud_commands(page.read_text()))
]


def test_the_docs_print_gcloud_commands_to_check():
    pages = {param.id.split(":")[0] for param in COMMANDS}
    assert {"docs/library.md", "docs/deploying.md", "docs/jobs.md"} <= pages and len(COMMANDS) >= 20


def test_a_misspelt_flag_is_told_apart(tmp_path):
    assert (
        parse("gcloud scheduler jobs create http nightly --location=us-central1 --schedul='0 2 * * *'", tmp_path)[0]
        == 2
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_gcloud_command_in_the_docs_parses(command, tmp_path):
    code, said = parse(command, tmp_path)
    assert code != 2 and PARSED in said, said[-2000:]
