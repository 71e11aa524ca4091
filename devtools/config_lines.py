"""`python -m devtools.config_lines`: the lines that validate jobs.yaml and scheduler.yaml.

Issue 36 §5 asks for the lines of configuration validation before and after the declared
models.  Counted as code lines (not blank, comment or docstring lines) of the definitions
that check the two files, named below for each revision: the hand-written parsers before
(76d7d77^ for jobs.yaml, 90b96dd^ for scheduler.yaml) and the declared models now (the
working tree, or ``--at REV``).  A definition is a top-level name (a function, class or
constant) or ``Class.method``.  docs/architecture.md records the figures; the count depends
on the code only.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import subprocess
import sys
import tokenize
from collections.abc import Iterable, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Selection = Mapping[str, tuple[str, ...]]

# scheduler.yaml's definitions that kept their names: its patterns, its problems and its entry.
_SCHEDULER_KEPT = (
    "SCHEDULER_LOCATION",
    "_DURATION",
    "_DURATION_PART",
    "_UNITS",
    "_RESERVED_HEADER",
    "Problem",
    "ScheduleFileError",
    "parse_scheduler_document",
)
_KINDS_BEFORE: Selection = {
    "jobs/kinds/http.py": (
        "METHODS",
        "RESERVED_HEADERS",
        "HttpJob.required_keys",
        "HttpJob.optional_keys",
        "HttpJob.from_config",
    ),
    "jobs/kinds/google_api.py": ("resource_name", "GoogleApi.from_config"),
    "jobs/kinds/workflow.py": ("WorkflowJob.required_keys", "WorkflowJob.optional_keys", "WorkflowJob.from_config"),
    "jobs/kinds/cloud_run_job.py": (
        "_ENV_NAME",
        "CloudRunJob.required_keys",
        "CloudRunJob.optional_keys",
        "CloudRunJob.from_config",
        "env_problem",
        "_env_text",
    ),
    "jobs/kinds/cloud_build_trigger.py": (
        "_SUBSTITUTION",
        "substitution_problem",
        "CloudBuildTriggerJob.required_keys",
        "CloudBuildTriggerJob.optional_keys",
        "CloudBuildTriggerJob.from_config",
        "_text",
    ),
    "jobs/kinds/python.py": ("_TARGET", "PythonJob.required_keys", "PythonJob.from_config"),
}
# The hand-written checks, as they were before issue 36's declared models.
BEFORE: dict[str, tuple[str | None, Selection]] = {
    "jobs.yaml (and kinds)": (
        "76d7d77^",
        {
            "jobs/config.py": ("COMMON_KEYS", "MAX_JOB_ID_CHARS", "_JOB_ID", "parse_jobs", "_parse_job"),
            "jobs/base.py": (
                "JobKind.required_keys",
                "JobKind.optional_keys",
                "JobKind.from_config",
                "positive_number",
                "text_value",
                "http_url",
                "_PLACEHOLDER_DOMAINS",
                "_PLACEHOLDER_TLDS",
                "is_placeholder_host",
                "checked_mapping",
            ),
            **_KINDS_BEFORE,
        },
    ),
    "scheduler.yaml": (
        "90b96dd^",
        {
            "schedules/config.py": (
                "JOB_KEYS",
                "RETRY_KEYS",
                *_SCHEDULER_KEPT,
                "_parse_job",
                "_parse_retry",
                "_duration",
                "_start_at",
                "_CRON_TOKEN",
                "_plain_cron_field",
                "_known_time_zone",
                "_tz_database",
            ),
        },
    ),
    "scheduler.yaml against jobs.yaml": (
        "90b96dd^",
        {"schedules/config.py": ("delivery_problem", "_DELIVERY_FIELDS", "dedup_problems")},
    ),
}


_KINDS_NOW: Selection = {
    "jobs/kinds/http.py": ("METHODS", "RESERVED_HEADERS", "_method", "header_problem", "HttpDeclaration"),
    "jobs/kinds/google_api.py": ("_resource_pattern", "resource_name", "GoogleApiDeclaration"),
    "jobs/kinds/workflow.py": ("_argument", "WorkflowDeclaration"),
    "jobs/kinds/cloud_run_job.py": (
        "_ENV_NAME",
        "RESERVED_ENV",
        "_args",
        "_container",
        "CloudRunJobDeclaration",
        "env_problem",
        "_env_text",
    ),
    "jobs/kinds/cloud_build_trigger.py": ("_SUBSTITUTION", "substitution_problem", "CloudBuildTriggerDeclaration"),
    "jobs/kinds/python.py": ("_target", "PythonDeclaration"),
}
# The declared models now, with their checks and the wording of pydantic's errors.
NOW: dict[str, tuple[str | None, Selection]] = {
    "jobs.yaml (and kinds)": (
        None,
        {
            "jobs/declared.py": ("*",),
            "dedup/run_record.py": ("MAX_JOB_ID_CHARS",),
            "jobs/config.py": (
                "JOB_ID_PATTERN",
                "parse_jobs",
                "JobsFile",
                "jobs_file_model",
                "_config_error",
                "_spec",
            ),
            "jobs/base.py": ("url_problem", "_PLACEHOLDER_DOMAINS", "_PLACEHOLDER_TLDS", "is_placeholder_host"),
            **_KINDS_NOW,
        },
    ),
    "scheduler.yaml": (
        None,
        {
            "schedules/config.py": (
                *_SCHEDULER_KEPT,
                "_duration",
                "_within",
                "_required",
                "_cron",
                "_CRON_TOKEN",
                "_plain_cron_field",
                "_string",
                "_name",
                "_time_zone",
                "_method",
                "_body",
                "_headers",
                "_note",
                "_start_at",
                "_DURATION_SCHEMA",
                "Duration",
                "_Window",
                "_Deadline",
                "_String",
                "_Streak",
                "_Schedule",
                "_Project",
                "_Location",
                "RetryConfig",
                "SchedulerJob",
                "_merge_defaults",
                "SchedulerFile",
                "_problem",
                "_known_time_zone",
                "_tz_database",
            ),
        },
    ),
    "scheduler.yaml against jobs.yaml": (
        None,
        {"schedules/config.py": ("delivery_problem", "_DELIVERY_FIELDS", "dedup_problems")},
    ),
}


def code_lines(source: str, names: Iterable[str]) -> dict[str, int]:
    """The code lines of each named definition of ``source`` (a name it lacks counts 0)."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for child in body:
                if (
                    isinstance(child, ast.Expr)
                    and isinstance(child.value, ast.Constant)
                    and isinstance(child.value.value, str)
                ):
                    docstrings.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code.update(range(token.start[0], token.end[0] + 1))
    code -= docstrings
    spans = dict(_definitions(tree.body, ""))
    if tuple(names) == ("*",):  # the whole module
        names = [name for name in spans if "." not in name]
    return {name: len(code & spans[name]) if name in spans else 0 for name in names}


def _definitions(body: list[ast.stmt], prefix: str) -> Iterable[tuple[str, set[int]]]:
    for node in body:
        lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            decorators = {d.lineno for d in node.decorator_list}
            yield prefix + node.name, lines | decorators
            if isinstance(node, ast.ClassDef):
                yield from _definitions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    yield prefix + target.id, lines


def _source(path: str, revision: str | None) -> str:
    if revision is None:
        with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
            return handle.read()
    return subprocess.run(
        ["git", "show", f"{revision}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def count(revision: str | None, selection: Selection) -> tuple[int, dict[str, int]]:
    """The total, and the lines of each ``path:name``; a name the revision lacks is an error."""
    found: dict[str, int] = {}
    for path, names in selection.items():
        source = _source(path, revision)
        for name, lines in code_lines(source, names).items():
            if lines == 0:
                raise SystemExit(f"{path} at {revision or 'the working tree'} has no definition {name!r}")
            found[f"{path}:{name}"] = lines
    return sum(found.values()), found


def figures(table: Mapping[str, tuple[str | None, Selection]]) -> dict[str, int]:
    """Each part's lines, and their ``total``."""
    parts = {part: count(revision, selection)[0] for part, (revision, selection) in table.items()}
    return {**parts, "total": sum(parts.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--each", action="store_true", help="the lines of each definition as well")
    args = parser.parse_args(argv)
    before, now = figures(BEFORE), figures(NOW)
    print(f"{'':34} {'before':>7} {'now':>7}")
    for part in before:
        print(f"{part:34} {before[part]:7} {now[part]:7}")
    if args.each:
        for label, table in (("before", BEFORE), ("now", NOW)):
            for part, (revision, selection) in table.items():
                print(f"\n{label}, {part}:")
                for name, lines in sorted(count(revision, selection)[1].items(), key=lambda item: -item[1]):
                    print(f"{lines:5}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
