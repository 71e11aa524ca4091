"""The coverage floor may only rise: pyproject.toml's ``fail_under`` (which fails `make test` below it)
is the total docs/testing.md quotes, rounded down, and is no lower than the last commit's."""

from __future__ import annotations

import math
import os
import re
import subprocess
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# docs/testing.md, "Coverage": "... the total was **84.3 %** ..."
QUOTED = re.compile(r"the total was \*\*(\d+(?:\.\d+)?) %\*\*")


def floor(pyproject: str) -> float | None:
    return tomllib.loads(pyproject).get("tool", {}).get("coverage", {}).get("report", {}).get("fail_under")


def current_pyproject() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        return handle.read()


def test_the_floor_is_the_total_docs_testing_md_quotes_rounded_down():
    with open(os.path.join(ROOT, "docs", "testing.md"), encoding="utf-8") as handle:
        quoted = QUOTED.findall(handle.read())
    assert len(quoted) == 1, "docs/testing.md should quote the coverage total once, as 'the total was **N %**'"
    fail_under = floor(current_pyproject())
    assert fail_under == math.floor(float(quoted[0])), (
        f"pyproject.toml's fail_under is {fail_under}; docs/testing.md quotes {quoted[0]} %: "
        "measure again (`make test`) and set both"
    )


def test_the_floor_is_no_lower_than_the_last_commits():
    committed = subprocess.run(
        ["git", "show", "HEAD:pyproject.toml"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    before = floor(committed.stdout) if committed.returncode == 0 else None
    if before is not None:  # else no commit had a floor yet
        assert floor(current_pyproject()) >= before, f"the coverage floor was {before}: it may only rise"
