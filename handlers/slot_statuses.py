"""Every status a slot or a run is shown with, and all that the pages make of it, in one table.

A status (schedules.slots.ExecutionStatus says which, and why) is shown as a badge and a
timeline mark, explained in the legend, counted on its job's home row when it needs attention,
and offered to the history page's bulk run when running it is the cure.  Each of those used to
be a list of its own in its own module (and the colours lived only in the stylesheet), so a new
status could be missed by any of them.  Here each status is one entry; the import fails if any
status lacks one, and the pages, the stylesheet included, are drawn from the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import schedules.slots
from schedules.slots import ExecutionStatus

AMBER, BROWN, GREEN, GREY, BLUE, PURPLE, RED, SLATE = (
    "#9a6700",
    "#bc4c00",
    "#1a7f37",
    "#6e7781",
    "#0969da",
    "#8250df",
    "#cf222e",
    "#57606a",
)


@dataclasses.dataclass(frozen=True)
class StatusTraits:
    """What a status means (the legend's words), how it is drawn (a badge's and a mark's
    ``colour``; the mark's ``shape``, an SVG path about 12 px across around (0, 0), so no status
    is told by colour alone), ``attention``: where the home row counts it among the statuses that
    need attention (None: it does not count it), and whether it ``runs_in_bulk`` (the history
    page offers to run such slots, each under its own key)."""

    meaning: str
    colour: str
    shape: str
    attention: int | None = None
    runs_in_bulk: bool = False


# In the legend's order.  Rings and frames are drawn with the even-odd rule (base.html).
STATUSES: Mapping[ExecutionStatus, StatusTraits] = {
    ExecutionStatus.COMPLETED: StatusTraits("ran, once", GREEN, "M0,-6A6,6 0 1,1 0,6A6,6 0 1,1 0,-6Z"),  # a disc
    ExecutionStatus.FAILED: StatusTraits(
        "ran and failed for good",
        RED,
        "M-6,-3.5L-3.5,-6L0,-2.5L3.5,-6L6,-3.5L2.5,0L6,3.5L3.5,6L0,2.5L-3.5,6L-6,3.5L-2.5,0Z",  # a cross
        attention=2,
        runs_in_bulk=True,
    ),
    ExecutionStatus.IN_PROGRESS: StatusTraits("running, its lease still held", BLUE, "M-5,-6L6,0L-5,6Z"),  # a triangle
    ExecutionStatus.STUCK: StatusTraits(
        "an attempt started, its lease is over and it never finished: it may have taken effect",
        BROWN,
        "M-5.5,-5.5H5.5V5.5H-5.5Z",
        attention=5,  # a square
    ),
    ExecutionStatus.RELEASED: StatusTraits(
        "failed in a way a retry may cure; the next delivery runs it again",
        PURPLE,
        "M0,-7L7,0L0,7L-7,0Z",  # a diamond
    ),
    ExecutionStatus.SKIPPED: StatusTraits("delivered later than its job allows: not run", GREY, "M-6,-2.5H6V2.5H-6Z"),
    ExecutionStatus.MISSED: StatusTraits(
        "an expected execution that never ran",
        RED,
        # a ring
        "M0,-6.5A6.5,6.5 0 1,1 0,6.5A6.5,6.5 0 1,1 0,-6.5ZM0,-3.5A3.5,3.5 0 1,0 0,3.5A3.5,3.5 0 1,0 0,-3.5Z",
        attention=1,
        runs_in_bulk=True,
    ),
    ExecutionStatus.DUE: StatusTraits(
        "expected, its retry window still open", AMBER, "M0,-3A3,3 0 1,1 0,3A3,3 0 1,1 0,-3Z"
    ),
    ExecutionStatus.UPCOMING: StatusTraits(
        "not yet due",
        AMBER,
        "M0,-6A6,6 0 1,1 0,6A6,6 0 1,1 0,-6ZM0,-4.8A4.8,4.8 0 1,0 0,4.8A4.8,4.8 0 1,0 0,-4.8Z",  # a thin ring
    ),
    ExecutionStatus.LATE: StatusTraits(
        "completed after its finish_within",
        AMBER,
        "M-3,-6H3L6,0L3,6H-3L-6,0Z",
        attention=3,  # a hexagon
    ),
    ExecutionStatus.OVERDUE: StatusTraits(
        "not completed, its finish_within passed",
        BROWN,
        "M0,-7L1.8,-2.3L6.7,-2.2L2.9,0.9L4.1,5.7L0,3L-4.1,5.7L-2.9,0.9L-6.7,-2.2L-1.8,-2.3Z",  # a star
        attention=4,
    ),
    ExecutionStatus.PAUSED: StatusTraits(
        "its Scheduler job was paused: nothing was to be delivered",
        SLATE,
        "M-5,-6H-1.5V6H-5ZM1.5,-6H5V6H1.5Z",  # two bars, the pause sign
    ),
    ExecutionStatus.EXCLUDED: StatusTraits(
        "in one of its Scheduler job's exclusion windows (planned downtime): not expected, not run",
        SLATE,
        "M-6,-6H6L0,0L6,6H-6L0,0Z",  # an hourglass: time set aside
    ),
    ExecutionStatus.COVERED: StatusTraits(
        "a compacted catch-up's run stands for it (compacted_into): it never runs on its own",
        GREEN,
        "M-6,-6H6V-3H-6ZM-6,-1.5H6V1.5H-6ZM-6,3H6V6H-6Z",  # three bars: folded into one
    ),
    ExecutionStatus.UNKNOWN: StatusTraits(
        "older than the job's retention: its record may have expired",
        SLATE,
        "M-6,-6H6V6H-6ZM-3.5,-3.5V3.5H3.5V-3.5Z",  # a square frame
    ),
    ExecutionStatus.UNTRACKED: StatusTraits(
        "before the app knew the schedule: never expected of it",
        SLATE,
        "M-6,-1H6V1H-6Z",  # a thin line
    ),
    ExecutionStatus.CONFLICT: StatusTraits(
        "another job's run holds the slot's key",
        AMBER,
        "M-6,-5H6L0,6Z",  # a triangle, pointing down
    ),
}
if set(STATUSES) != set(ExecutionStatus):  # a status added to the enum and not here fails every import
    raise RuntimeError(f"handlers/slot_statuses.py lacks {sorted(set(ExecutionStatus) - set(STATUSES))}")

# What the pages read, derived from the one table.
LEGEND: tuple[tuple[str, str], ...] = tuple((str(status), traits.meaning) for status, traits in STATUSES.items())
MARK_SHAPES: dict[str, str] = {str(status): traits.shape for status, traits in STATUSES.items()}
# The home row's counts, in the order it shows them: missed, failed, late, overdue, stuck.
NEEDS_ATTENTION = tuple(
    sorted(
        (status for status, traits in STATUSES.items() if traits.attention is not None),
        key=lambda s: STATUSES[s].attention or 0,
    )
)
if set(NEEDS_ATTENTION) != set(schedules.slots.NEEDS_ATTENTION):  # the audit's index counts the same statuses
    raise RuntimeError("handlers/slot_statuses.py's attention differs from schedules.slots.NEEDS_ATTENTION")
RUNS_IN_BULK = tuple(status for status, traits in STATUSES.items() if traits.runs_in_bulk)


def status_stylesheet() -> str:
    """The badges' and marks' colours, one rule per colour (the page's size stays as it was)."""
    by_colour: dict[str, list[str]] = {}
    for status, traits in STATUSES.items():
        by_colour.setdefault(traits.colour, []).append(str(status))
    badges = " ".join(
        f"{', '.join('.' + s for s in names)} {{ background: {colour}; }}" for colour, names in by_colour.items()
    )
    marks = " ".join(
        f"{', '.join('.mark.' + s for s in names)} {{ fill: {colour}; }}" for colour, names in by_colour.items()
    )
    return f"{badges}\n  {marks}"


STATUS_STYLESHEET = status_stylesheet()
