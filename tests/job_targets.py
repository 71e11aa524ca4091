"""Python job targets the tests declare in their jobs files.

In-process tests observe side effects through EFFECTS; tests against a real
gunicorn (other processes) use file_effect, which appends to a file.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time

from jobs import PermanentJobError, RetryableJobError, RunContext

EFFECTS: list[dict] = []
GATES: dict[str, threading.Event] = {}
STARTED: dict[str, threading.Event] = {}
FAILURES: dict[str, list] = {}
TRACE_HEADERS: list[dict[str, str]] = []
_lock = threading.Lock()


def reset() -> None:
    with _lock:
        EFFECTS.clear()
        GATES.clear()
        STARTED.clear()
        FAILURES.clear()
        TRACE_HEADERS.clear()
        STEP_CALLS.clear()
        LOSE_ANSWER.clear()


def _effect(context: RunContext) -> dict:
    entry = {
        "run_id": context.run_id,
        "attempt": context.attempt,
        "attempt_id": context.attempt_id,
        "job_id": context.job_id,
        "schedule_time": context.schedule_time,
        "project": context.project,
        "location": context.location,
        "body": context.body,
        "parameters": dict(context.parameters),
        "source": context.source,
        "client_token": context.client_token,
        "covers": [time.isoformat() for time in context.covers],
    }
    with _lock:
        EFFECTS.append(entry)
    return entry


def record(context: RunContext) -> dict:
    _effect(context)
    return {"done": True, "attempt": context.attempt}


def trace_headers(context: RunContext) -> dict:
    """What a python job would put on its own calls: the run's trace."""
    with _lock:
        TRACE_HEADERS.append(context.trace_headers())
    return {"done": True}


def echo_value(context: RunContext):
    """Return body["value"] (or parameters["value"]): lets tests store falsy results."""
    _effect(context)
    return (context.body_json() or context.parameters)["value"]


def scripted_failures(context: RunContext):
    """Fail as FAILURES[job_id] says, one entry per attempt: 'permanent', 'retryable', 'crash', 'bad-result'."""
    _effect(context)
    with _lock:
        plan = FAILURES.get(context.job_id) or []
        step = plan.pop(0) if plan else None
    if step == "permanent":
        raise PermanentJobError("the invoice was rejected", details={"code": "REJECTED"})
    if step == "retryable":
        raise RetryableJobError("the bank is busy")
    if step == "crash":
        raise ZeroDivisionError("a bug")
    if step == "bad-result":
        return {"not-json": object()}
    if step == "deep-result":
        deep: list = []
        for _ in range(100000):
            deep = [deep]
        return deep  # json.dumps raises RecursionError
    return {"ok": True, "attempt": context.attempt}


def gated(context: RunContext) -> dict:
    """Block until the test opens GATES[body] (signals STARTED[body] first)."""
    return _wait_at_gate(context.body.decode(), context)


def _wait_at_gate(name: str, context: RunContext) -> dict:
    with _lock:
        gate = GATES.setdefault(name, threading.Event())
        started = STARTED.setdefault(name, threading.Event())
    started.set()
    if not gate.wait(timeout=30):
        raise RuntimeError("gate never opened")
    _effect(context)
    return {"gate": name, "attempt": context.attempt}


def file_effect(context: RunContext) -> dict:
    """For live tests: body {"dir": D, "sleep": S, "fail": F}; append one line to D/<run_id> per
    execution (then, with F, fail permanently)."""
    options = dict(context.parameters) or context.body_json() or {}
    if options.get("pidfile"):
        with open(options["pidfile"], "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {context.attempt}")
    time.sleep(float(options.get("sleep", 0)))
    path = os.path.join(options["dir"], context.run_id)
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps({"attempt": context.attempt, "pid": os.getpid()}) + "\n")
    if options.get("fail"):  # the effect happened, then the job failed for good
        raise PermanentJobError("the effect was made, then refused", details={"attempt": context.attempt})
    return {"pid": os.getpid(), "attempt": context.attempt}


def echo_parameter(context: RunContext):
    """Return parameters["value"] (manual runs)."""
    _effect(context)
    return context.parameters.get("value")


def gated_parameter(context: RunContext) -> dict:
    """Like gated, with the gate named by parameters["gate"] (manual runs)."""
    return _wait_at_gate(context.parameters["gate"], context)


def file_gate(context: RunContext) -> dict:
    """For live tests: wait until parameters["gate_file"] exists (at most 30 s), then return."""
    deadline = time.monotonic() + 30
    while not os.path.exists(context.parameters["gate_file"]):
        if time.monotonic() > deadline:
            raise RuntimeError("the gate file never appeared")
        time.sleep(0.05)
    return {"gate": "open", "attempt": context.attempt}


def downstream_named(context: RunContext) -> dict:
    """Record the downstream resource named by body["name"] (tests of the name's bounds)."""
    recorded = context.record_downstream(context.body_json()["name"])
    _effect(context)
    return {"recorded": recorded}


def refuse(context: RunContext) -> dict:
    """For live tests: always a permanent failure (a 422 the client must not retry)."""
    raise PermanentJobError("the request was refused", details={"parameters": dict(context.parameters)})


# What a stepped job's downstream saw: (step, key) per call.  LOSE_ANSWER makes the charge's call
# take effect, then lose its answer (a retryable error), as a connection reset after sending does.
STEP_CALLS: list[tuple[str, str]] = []
LOSE_ANSWER: set[str] = set()


def stepped(context: RunContext) -> dict:
    """Three steps: reserve (at_least_once), charge (at_most_once, on_unknown review), notify."""

    def call(step: str):
        def downstream(key: str) -> dict:
            with _lock:
                STEP_CALLS.append((step, key))
            if step in LOSE_ANSWER:
                LOSE_ANSWER.discard(step)
                raise RetryableJobError(f"{step}: the connection was reset after the request was sent")
            return {"step": step, "attempt": context.attempt}

        return downstream

    reserved = context.step("reserve", call("reserve"))
    charged = context.step("charge", call("charge"), semantic="at_most_once", on_unknown="review")
    context.step("notify", call("notify"))
    return {"reserved": reserved, "charged": charged}


def file_steps(context: RunContext) -> dict:
    """For live tests: three steps (reserve, charge at most once with review, notify), each
    appending {step, key, attempt} to D/<run_id>.steps.  Body {"dir": D, "kill_in": STEP,
    "pidfile": P}: attempt 1 writes its pid to P right after STEP's effect, then waits to be killed."""
    options = context.body_json() or {}

    def effect(step: str):
        def call(key: str) -> dict:
            path = os.path.join(options["dir"], f"{context.run_id}.steps")
            with open(path, "a", encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.write(json.dumps({"step": step, "key": key, "attempt": context.attempt}) + "\n")
            if options.get("kill_in") == step and context.attempt == 1:
                with open(options["pidfile"], "w", encoding="utf-8") as handle:
                    handle.write(f"{os.getpid()} {context.attempt}")
                time.sleep(60)  # the test kills this worker here: after the effect, before its record
            return {"step": step, "attempt": context.attempt}

        return call

    context.step("reserve", effect("reserve"))
    context.step("charge", effect("charge"), semantic="at_most_once", on_unknown="review")
    context.step("notify", effect("notify"))
    return {"steps": 3}
