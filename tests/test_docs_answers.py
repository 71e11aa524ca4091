"""What the docs say the app answers is what it answers: the README's curl walkthrough is run
against the app, each documented answer held to the real one (status, headers, and the keys of
its JSON at every depth), and docs/seeing-runs.md's filter values are the ones the run API takes.

A documented body may leave things out with ``...`` (a key's value, or keys: then it names a
subset); otherwise its keys are exactly the real answer's, so a key the app adds or drops fails
here until the docs show it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dedup.run_record import RunSource, RunStatus
from examples import demo_jobs
from tests.support.deliveries import JOBS
from tests.support.downstream import Downstream, Reply

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WALKTHROUGH = "## Try it: play Cloud Scheduler with curl"
STRING = re.compile(r'("(?:[^"\\]|\\.)*")')  # a JSON string, captured: re.split keeps it
LEFT_OUT = re.compile(r",?\s*\.\.\.(?:[^.]*\.\.\.)?")  # ", ... same result ..." or ", ..."


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as handle:
        return handle.read()


def section(text: str, heading: str) -> str:
    return text.partition(f"\n{heading}\n")[2].partition("\n## ")[0]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """The ``` blocks of a text, in order, as (language, content)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


@dataclasses.dataclass
class Curl:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    background: bool


def curl_commands(script: str) -> list[Curl]:
    """The curl commands of a shell block (continuation lines joined); other commands are skipped."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        if not words or words[0] != "curl":
            continue
        background = words[-1] == "&"
        method, headers, body, path = "GET", {}, b"", ""
        arguments = iter(words[1 : -1 if background else None])
        for word in arguments:
            if word == "-X":
                method = next(arguments)
            elif word == "-H":
                name, _, value = next(arguments).partition(":")
                headers[name.strip()] = value.strip()
            elif word == "-d":
                body = next(arguments).encode()
                method = "POST" if method == "GET" else method
                headers.setdefault("Content-Type", "application/x-www-form-urlencoded")  # as curl sends
            elif word.startswith("-"):
                assert word == "-i", f"the README's curl uses {word}, which this test does not translate"
            else:
                path = "/" + word.partition("/")[2]
        commands.append(Curl(method, path, headers, body, background))
    return commands


@dataclasses.dataclass
class Answer:
    status: int
    headers: list[str]
    body: Any
    abbreviated: bool


def documented_answer(block: str) -> Answer:
    """An answer as the README shows it: its status line, headers and JSON, ``...`` allowed."""
    head, _, body = block.partition("\n\n")
    status_line, *header_lines = head.splitlines()
    pieces = STRING.split(body)  # outside strings (the even pieces), "..." stands for keys left out
    outside = [LEFT_OUT.sub("", piece) for piece in pieces[::2]]
    pieces[::2] = outside
    return Answer(
        status=int(status_line.split()[1]),
        headers=[line.partition(":")[0] for line in header_lines],
        body=json.loads("".join(pieces)),
        abbreviated=outside != STRING.split(body)[::2],
    )


def walkthrough() -> Iterator[tuple[list[Curl], Curl, Answer]]:
    """Each documented answer with the command it answers (the last curl before it, or the same
    again) and the background commands started since the previous answer."""
    last, background = None, []
    for language, content in fenced_blocks(section(read("README.md"), WALKTHROUGH)):
        if language == "sh":
            for command in curl_commands(content):
                if command.background:
                    background.append(command)
                else:
                    last = command
        elif content.startswith("HTTP/1.1 "):
            assert last is not None, "an answer before any command"
            yield background, last, documented_answer(content)
            background = []


def shape_mismatches(documented: Any, real: Any, subset: bool, where: str = "body") -> list[str]:
    if not isinstance(documented, dict):
        return []
    if not isinstance(real, dict):
        return [f"{where}: documented as an object, answered {real!r}"]
    problems = []
    if unanswered := sorted(documented.keys() - real.keys()):
        problems.append(f"{where}: documents {unanswered}, which the app does not answer")
    if not subset and (undocumented := sorted(real.keys() - documented.keys())):
        problems.append(f"{where}: answers {undocumented}, which the docs do not show")
    for key in documented.keys() & real.keys():
        problems += shape_mismatches(documented[key], real[key], subset, f"{where}.{key}")
    return problems


class Sleeps:
    """slow-report's time.sleep: foreground runs return at once; a background run holds its
    lease until the test has seen the answer given meanwhile."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released.set()
        self.started = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.started.set()
        assert self.released.wait(30), "never released"


@pytest.fixture
def local_app(make_client, monkeypatch):
    """The app as `make run` serves it (examples/local-jobs.yaml), sync-crm's downstream stood in for."""
    sleeps = Sleeps()
    monkeypatch.setattr(demo_jobs, "time", sleeps)
    with Downstream() as downstream:
        downstream.default = Reply(201, b'{"applied": true}')
        jobs = yaml.safe_load(read("examples/local-jobs.yaml"))
        jobs["jobs"]["sync-crm"]["url"] = f"{downstream.url}/hooks/sync"
        yield make_client(yaml.safe_dump(jobs)), sleeps


def send(client, command: Curl):
    return client.request(
        command.path, method=command.method, headers=command.headers, body=command.body, expect_errors=True
    )


def test_the_walkthrough_is_read_whole():
    steps = list(walkthrough())
    assert [answer.status for _, _, answer in steps] == [200, 200, 409, 201]
    assert [len(background) for background, _, _ in steps] == [0, 0, 1, 0]
    # The 409 leaves out message (the detail again).
    assert [answer.abbreviated for _, _, answer in steps] == [False, True, True, False]


def test_the_readme_walkthrough_answers_as_documented(local_app):
    client, sleeps = local_app
    problems = []
    for background, command, documented in walkthrough():
        threads = []
        for started in background:  # `curl ... &`: it runs, and holds its lease, while the next is sent
            sleeps.released.clear()
            sleeps.started.clear()
            threads.append(threading.Thread(target=send, args=(client, started)))
            threads[-1].start()
            assert sleeps.started.wait(30)
        real = send(client, command)
        sleeps.released.set()
        for thread in threads:
            thread.join(30)
        where = f"{command.method} {command.path} (documented {documented.status})"
        if real.status_int != documented.status:
            problems.append(f"{where}: answered {real.status_int} {real.text}")
            continue
        problems += [f"{where}: no header {name}" for name in documented.headers if name not in real.headers]
        problems += [f"{where} {p}" for p in shape_mismatches(documented.body, real.json, documented.abbreviated)]
    assert not problems, "README.md's walkthrough is not what the app answers:\n" + "\n".join(problems)


def documented_values(doc: str, pattern: str) -> list[str]:
    found = re.search(pattern, read(doc), re.S)
    assert found, f"{doc} no longer says {pattern!r}"
    return re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", found.group(1)))  # what a value is, in (), aside


@pytest.mark.parametrize(
    "name, pattern, values",
    [
        ("status", r"`status` one of (.*?);", [s.value for s in RunStatus]),
        ("source", r"`source` (.*?);", [s.value for s in RunSource]),
    ],
)
def test_the_run_api_takes_the_filter_values_seeing_runs_lists(make_client, name, pattern, values):
    documented = documented_values("docs/seeing-runs.md", pattern)
    client = make_client(JOBS)
    for value in documented:
        client.get(f"/api/v1/runs?{name}={value}", status=200)
    refused = client.get(f"/api/v1/runs?{name}=nope", status=400).json["message"]
    taken = re.findall(r"\w+", refused.partition("one of")[2])
    assert sorted(documented) == sorted(taken) == sorted(values), (
        f"docs/seeing-runs.md lists {name} {documented}; the API takes {taken}"
    )


def test_the_deploy_guide_names_every_kind_the_app_stores():
    """A shared project's operator reads docs/deploying.md to know which kinds are this app's."""
    import importlib
    import pkgutil

    from google.cloud import ndb

    import models

    kinds = set()
    for module in pkgutil.iter_modules(models.__path__):
        for value in vars(importlib.import_module(f"models.{module.name}")).values():
            if isinstance(value, type) and issubclass(value, ndb.Model) and value is not ndb.Model:
                kinds.add(value._get_kind())
    with open(os.path.join(ROOT, "docs", "deploying.md"), encoding="utf-8") as handle:
        guide = " ".join(handle.read().split())
    assert len(kinds) >= 6 and {kind for kind in kinds if f"`{kind}`" not in guide} == set()
