""".pre-commit-config.yaml runs, though pre-commit is not installed here: each hook is local, runs a
tool of the virtualenv (no network at commit time), and its ``entry`` succeeds on the whole tree,
run as ``pre-commit run --all-files`` would run it: from the repository's root, the entry split
as a shell would, its ``args``, then every Python file of the tree (tracked, and new files git
does not ignore) unless ``pass_filenames: false``."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
import yaml

from tests.support.tree import tree_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, ".pre-commit-config.yaml")


def hooks() -> list[dict]:
    with open(CONFIG, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def python_files() -> list[str]:
    """What pre-commit's ``types_or: [python, pyi]`` selects: .py and .pyi files, and scripts whose
    first line names python."""
    found = []
    for path in tree_files():
        full = os.path.join(ROOT, path)
        if path.endswith((".py", ".pyi")):
            found.append(path)
        elif "." not in os.path.basename(path):
            with open(full, "rb") as handle:
                first = handle.readline()
            if first.startswith(b"#!") and b"python" in first:
                found.append(path)
    return found


def test_the_hooks_are_ruff_check_ruff_format_and_mypy():
    assert [hook["id"] for hook in hooks()] == ["ruff-check", "ruff-format", "mypy"]


def test_every_hook_is_local_and_runs_a_tool_of_the_virtualenv():
    with open(CONFIG, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    assert [repo["repo"] for repo in config["repos"]] == ["local"]  # nothing for pre-commit to download
    for hook in hooks():
        assert hook["language"] == "system", hook["id"]
        program = shlex.split(hook["entry"])[0]
        assert program.startswith(".venv/bin/"), hook["id"]
        assert os.access(os.path.join(ROOT, program), os.X_OK), f"{hook['id']}: {program} is not installed"
    assert "--check" in shlex.split(next(h for h in hooks() if h["id"] == "ruff-format")["entry"])  # never rewrites


def run_hook(hook: dict) -> subprocess.CompletedProcess:
    command = [*shlex.split(hook["entry"]), *hook.get("args", [])]
    if hook.get("pass_filenames", True):
        command += python_files()
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


# make check runs ruff check, ruff format --check and mypy on the tree just before its tests (make
# lint): run again here they would only repeat it, so make test runs them (three tools, in processes
# of their own).
@pytest.mark.slow
@pytest.mark.parametrize("hook", hooks(), ids=lambda hook: hook["id"])
def test_every_hook_passes_on_the_whole_tree(hook):
    completed = run_hook(hook)
    assert completed.returncode == 0, f"{hook['entry']}:\n{completed.stdout}{completed.stderr}"
