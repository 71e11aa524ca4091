"""The shipped jobs.yaml and scheduler.yaml, with their placeholders filled in as a user would.

The shipped files name a reserved example host and a placeholder project, which validation
refuses (so they can never deploy as they are); tests that need the files to load use these
copies, which differ from the shipped ones in those values only.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Each shipped file, and the values a user replaces in it: placeholder -> a real-looking value.
FILL_INS = {
    "jobs.yaml": {"crm.example.com": "crm.acme-corp.internal"},
    "scheduler.yaml": {"your-project-id": "acme-prod"},
}


def filled_in(directory: Path) -> tuple[Path, Path]:
    """(jobs.yaml, scheduler.yaml) written to ``directory``, side by side as the app reads them."""
    written = []
    for name, replacements in FILL_INS.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        for placeholder, value in replacements.items():
            assert placeholder in text, f"{name} no longer holds {placeholder!r}: update {__name__}"
            text = text.replace(placeholder, value)
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written[0], written[1]
