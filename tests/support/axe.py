"""axe-core inside a Playwright page: the accessibility check issue 25 §7 asks of every page.

The engine is the npm package, vendored (tests/vendor/axe-core, its README says how), so the
browser tests never reach a registry; a file whose hash is not the recorded one is refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

AXE = Path(__file__).resolve().parent.parent / "vendor" / "axe-core" / "axe.min.js"
AXE_SHA256 = "29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c"
# What the issue refuses; "moderate" and "minor" findings are listed by the failure, not counted.
BLOCKING = ("serious", "critical")


def axe_source() -> str:
    data = AXE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != AXE_SHA256:
        raise RuntimeError(f"{AXE} is not axe-core 4.14.1 as vendored (sha256 {digest})")
    return data.decode("utf-8")


def violations(page: Any) -> list[dict[str, Any]]:
    """The serious and critical violations axe finds on ``page`` as it is now (WCAG 2.0 to 2.2, A and
    AA: 2.2's target-size too, at every width)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(content=axe_source())
    found = page.evaluate(
        """async () => (await axe.run(document, {runOnly: {type: "tag",
              values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]}})).violations
            .map(v => ({id: v.id, impact: v.impact, help: v.help,
                        nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))}))"""
    )
    return [v for v in found if v["impact"] in BLOCKING]
