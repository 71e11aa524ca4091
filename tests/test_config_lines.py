"""devtools/config_lines.py: the lines of configuration validation docs/architecture.md records."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import pytest

from devtools.config_lines import BEFORE, NOW, ROOT, code_lines, count, figures, main


def test_only_code_lines_count_not_docstrings_comments_or_blanks():
    source = textwrap.dedent(
        '''
        """The module's docstring."""
        LIMIT = 5  # counted: one line


        def check(value):
            """A docstring,
            over two lines."""
            # a comment
            if value > LIMIT:

                raise ValueError(
                    "too big"
                )
            return value


        class Job:
            """A class."""

            name: str
            """An attribute's docstring."""
            retries = 0

            def build(self):
                return self.name
        '''
    )
    assert code_lines(source, ["LIMIT", "check", "Job", "Job.build", "Job.retries"]) == {
        "LIMIT": 1,
        "check": 6,  # def, if, the three lines of the raise, return
        "Job": 5,  # class, name, retries, def build, return
        "Job.build": 2,
        "Job.retries": 1,
    }
    assert code_lines(source, ["missing"]) == {"missing": 0}


def test_a_definition_the_revision_lacks_is_an_error_not_a_zero():
    with pytest.raises(SystemExit, match="no definition 'no_such_check'"):
        count(None, {"jobs/config.py": ("parse_jobs", "no_such_check")})


def _documented() -> dict[str, tuple[int, int]]:
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as handle:
        section = handle.read().split("## Configuration validation, measured", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| (\d+) \| (\d+) \|$", section, re.M)
    return {part: (int(before), int(now)) for part, before, now in rows}


def _has_revision(revision: str) -> bool:
    found = subprocess.run(["git", "cat-file", "-e", f"{revision}^{{commit}}"], cwd=ROOT, capture_output=True)
    return found.returncode == 0


def test_the_docs_record_the_figures_the_command_prints(capsys):
    documented = _documented()
    now = figures(NOW)
    assert {part: figure for part, (_, figure) in documented.items()} == now
    if not all(_has_revision(revision) for revision, _ in BEFORE.values() if revision):
        pytest.skip("a shallow clone: the revisions before the declared models are not here")
    before = figures(BEFORE)
    assert {part: figure for part, (figure, _) in documented.items()} == before
    assert main([]) == 0
    printed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["total", str(before["total"]), str(now["total"])] in printed
