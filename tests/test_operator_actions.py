"""An operator action is complete when every surface offers it (docs/architecture.md, "Adding an
operator action"): the JSON API, the dashboard's form and, for an action the queue does, the task
endpoint that runs it.  An action is a public function of ``service/`` that acts for a
``principal``; one left out of this rule says why in ``NOT_OPERATOR_ACTIONS``.  Read from the
source (no app, no emulator): which adapter calls which service function."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_VIEWS = ("runs_api", "executions", "schedule_actions")  # the JSON API's views
FORM_VIEWS = ("dashboard_actions",)
TASK_VIEWS = ("tasks",)

# Functions that act for a principal but are no operator's action on their own.
NOT_OPERATOR_ACTIONS = {
    "run_delivery": "Cloud Scheduler's delivery (handlers/scheduler.py), not an operator's",
    "run_scheduled": "the run of a delivery or a slot, called by run_delivery and run_slot_now",
    "catch_up": "a part of resume_schedule",
    "set_schedule_paused": "a part of pause_schedule and resume_schedule, and of the failure-streak pause",
}


def operator_actions() -> dict[str, str]:
    """Each public service function with a ``principal`` parameter, and its module."""
    found = {}
    for path in sorted((ROOT / "service").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                if any(argument.arg == "principal" for argument in node.args.args):
                    found[node.name] = path.stem
    return found


def service_calls(view: str) -> set[str]:
    """The functions a handlers/ module imports from ``service/`` and uses (calls, or picks to call)."""
    tree = ast.parse((ROOT / "handlers" / f"{view}.py").read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("service.")
        for alias in node.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return imported & used


def called_by(views: tuple[str, ...]) -> set[str]:
    return set().union(*(service_calls(view) for view in views))


def later_form(action: str) -> str:
    """The name of an action's queued form: run_manually → run_manually_later, run_slot_now → run_slot_later."""
    return action.removesuffix("_now") + "_later"


def test_every_operator_action_is_offered_on_every_surface():
    actions = operator_actions()
    assert set(NOT_OPERATOR_ACTIONS) <= set(actions), "a function NOT_OPERATOR_ACTIONS names is gone"
    api, form, task = called_by(API_VIEWS), called_by(FORM_VIEWS), called_by(TASK_VIEWS)
    missing = []
    for action in sorted(set(actions) - set(NOT_OPERATOR_ACTIONS)):
        if action.endswith("_later"):  # the form's queued form of an action: the form calls it
            if action not in form:
                missing.append(f"{action}: no dashboard form calls it (handlers/dashboard_actions.py)")
            continue
        queued = later_form(action) in actions
        if action not in api:
            missing.append(f"{action}: no JSON API view calls it ({', '.join(API_VIEWS)})")
        if action not in form and later_form(action) not in form:
            missing.append(f"{action}: no dashboard form calls it or {later_form(action)}")
        if queued and action not in task:
            missing.append(
                f"{action}: queued by {later_form(action)}, but no task endpoint runs it (handlers/tasks.py)"
            )
    assert missing == []


def test_the_rule_sees_the_actions_there_are():
    """The rule reads what it should: the actions this app has, each on its surfaces."""
    actions = set(operator_actions()) - set(NOT_OPERATOR_ACTIONS)
    assert {"run_manually", "run_manually_later", "run_slot_now", "run_slot_later", "pause_schedule"} <= actions
    assert {"run_manually", "run_slot_now"} <= called_by(TASK_VIEWS)
