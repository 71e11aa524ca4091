"""The files of the tree as a commit would take them, for tests that hold a rule over all of them."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tree_files() -> list[str]:
    """Tracked files, and new ones git does not ignore, that exist in the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    return [path for path in listed if os.path.isfile(os.path.join(ROOT, path))]
