"""dedupctl's command line (Click, as ``python -m deploy``): run, runs, backfill, pause, resume, conformance.

``main`` is the console script ``dedupctl`` and ``python -m dedupctl``; its
return value is the exit code (``client.Exit``).  A bad argument is exit 2,
as a refused request is.
"""

from __future__ import annotations

import functools
import json
import os
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import click
import requests

from dedupctl.backfill import DEFAULT_ONLY, FORCED, REOPENABLE, Backfill, backfill
from dedupctl.client import Exit, RetryPolicy, run_with_retries
from dedupctl.conformance import DRAFT, DRAFT_DATE, Options, all_passed, format_table, run_suite
from dedupctl.output import out, say

TOKEN_ENV = "DEDUPCTL_ID_TOKEN"
ADC_EXTRA = "dedupctl[adc]"  # google-auth, for --audience (pyproject.toml)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit code, never an exception (argv: sys.argv[1:] when None)."""
    try:
        code = cli.main(args=argv, standalone_mode=False)
    except click.ClickException as exc:  # a usage error: exit 2, with Click's message
        exc.show()
        return exc.exit_code
    except click.Abort:
        say("interrupted")
        return 130
    return int(code) if code is not None else Exit.OK  # --help answers None


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    help=(
        "Start and read runs of a deployed app from scripts, retrying safely.\n\n"
        "A run gets one client token, printed before the first request, and the same request is sent "
        "again with it: however often an answer is lost, the job runs once. Exit codes: 0 done, "
        "2 refused (or bad arguments), 3 the run failed, 4 the token was used with other parameters, "
        "5 gave up (resume with the same --token)."
    ),
)
def cli() -> None:
    pass


def _with_credentials(command: Callable[..., int]) -> Callable[..., int]:
    """--url, --audience and --no-auth; the command gets ``url`` and the request ``headers``."""

    @click.option("--url", required=True, help="The app's base URL, e.g. https://PROJECT.appspot.com.")
    @click.option("--audience", help="The IAP OAuth client id to get an ID token for (service accounts, ADC).")
    @click.option("--no-auth", is_flag=True, help="Send no credentials (make run).")
    @functools.wraps(command)
    def with_headers(url: str, audience: str | None, no_auth: bool, **options: Any) -> int:
        try:
            headers = auth_headers(audience, no_auth)
        except CredentialsError as exc:
            say(str(exc))
            return Exit.REFUSED
        return command(url=url, headers=headers, **options)

    return with_headers


class CredentialsError(Exception):
    pass


def auth_headers(audience: str | None, no_auth: bool) -> dict[str, str]:
    """Authorization: Bearer <ID token> from DEDUPCTL_ID_TOKEN, or from ADC for --audience."""
    if no_auth:
        return {}
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        if not audience:
            raise CredentialsError(f"give --audience (the IAP OAuth client id), set {TOKEN_ENV}, or --no-auth")
        try:
            import google.auth.exceptions
            import google.auth.transport.requests
            import google.oauth2.id_token
        except ImportError:
            raise CredentialsError(
                f"--audience gets an ID token from Application Default Credentials with google-auth, "
                f"which is not installed: pip install '{ADC_EXTRA}', or set {TOKEN_ENV}"
            ) from None
        try:
            token = google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), audience)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise CredentialsError(f"no ID token for {audience}: {exc}") from None
    return {"Authorization": f"Bearer {token}"}


@cli.command(help="Start a run of JOB now, once, retrying safely with one client token.")
@click.argument("job")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A string parameter (repeatable).")
@click.option("--parameters-json", help="The parameters as a JSON object (--param adds to it).")
@click.option("--token", help="The client token (default: a new UUID4, printed to stderr first).")
@click.option("--wait", type=click.IntRange(0, 60), default=0, metavar="SECONDS", help="Prefer: wait=N (0 to 60).")
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 1000),
    default=RetryPolicy.max_attempts,
    show_default=True,
    help="Failed answers before giving up (a 409, a run in progress, uses none).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(1, 86400),
    default=RetryPolicy.deadline_seconds,
    metavar="SECONDS",
    show_default=True,
    help="Seconds before giving up.",
)
@click.option("--backoff", type=click.FloatRange(0.001, 60), default=RetryPolicy.backoff_base_seconds, hidden=True)
@_with_credentials
def run(
    url: str,
    headers: dict[str, str],
    job: str,
    params: tuple[str, ...],
    parameters_json: str | None,
    token: str | None,
    wait: int,
    max_attempts: int,
    deadline: float,
    backoff: float,
) -> int:
    try:
        parameters = _parameters(parameters_json, params)
    except ValueError as exc:
        say(str(exc))
        return Exit.REFUSED
    token = token or str(uuid.uuid4())
    # Before the first request: a script killed from here on can resume the same run.
    say(f"clientToken {token} (resume with --token {token})")
    url = f"{url.rstrip('/')}/api/v1/jobs/{urllib.parse.quote(job, safe='')}/runs"
    body = {"clientToken": token, "parameters": parameters}
    request_headers = {**headers, "Content-Type": "application/json"}
    if wait:
        request_headers["Prefer"] = f"wait={wait}"
    policy = RetryPolicy(max_attempts, deadline, backoff)
    session = requests.Session()

    def send(timeout: float) -> requests.Response:
        # No redirects: a POST turned into a GET (a sign-in page, http -> https) is not a run.
        return session.post(url, data=json.dumps(body), headers=request_headers, timeout=timeout, allow_redirects=False)

    def on_retry(attempt: int, why: str, delay: float) -> None:
        say(f"attempt {attempt}: {why}; the same request again in {delay:.1f} s")

    try:
        outcome = run_with_retries(send, policy, on_retry=on_retry)
    except requests.RequestException as exc:  # a bad URL, too many redirects: not the network's fault
        say(f"{url}: {exc}; resume with --token {token}")
        return Exit.REFUSED
    if outcome.body is not None:
        out(json.dumps(outcome.body) if not isinstance(outcome.body, str) else outcome.body)
    if outcome.exit == Exit.GAVE_UP:
        say(f"gave up after {outcome.attempts} attempt(s); resume with --token {token}")
    return outcome.exit


def _parameters(parameters_json: str | None, params: tuple[str, ...]) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    if parameters_json:
        parameters = json.loads(parameters_json)
        if not isinstance(parameters, dict):
            raise ValueError("--parameters-json must be a JSON object")
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {item!r}: give KEY=VALUE")
        parameters[key] = value
    return parameters


@cli.group(help="Read runs: the run API's list and whole records.")
def runs() -> None:
    pass


@runs.command("list", help="Runs newest first, a summary each (one page, with next_cursor).")
@click.option("--job", help="Only this job's runs.")
@click.option("--status", help="Only runs in this status (completed, failed, in_progress, ...).")
@click.option("--limit", type=int, help="At most this many (1 to 100; the app's default 50).")
@_with_credentials
def list_runs(url: str, headers: dict[str, str], job: str | None, status: str | None, limit: int | None) -> int:
    query = {name: value for name, value in (("job", job), ("status", status), ("limit", limit)) if value is not None}
    return _read(f"{url.rstrip('/')}/api/v1/runs", query, headers)


@runs.command("show", help="The whole record of run RUN_ID: parameters, attempts, result or error.")
@click.argument("run_id")
@_with_credentials
def show_run(url: str, headers: dict[str, str], run_id: str) -> int:
    return _read(f"{url.rstrip('/')}/api/v1/runs/{urllib.parse.quote(run_id, safe='')}", {}, headers)


def _read(url: str, query: dict[str, Any], headers: dict[str, str]) -> int:
    try:
        response = requests.get(
            url, params=query, headers=headers, timeout=RetryPolicy.timeout_seconds, allow_redirects=False
        )
    except requests.RequestException as exc:
        say(f"{url}: {exc}")
        return Exit.GAVE_UP
    out(response.text.rstrip())
    if response.status_code >= 500:
        return Exit.GAVE_UP  # the app or its front end failed: try again later
    return Exit.OK if response.status_code in (200, 201) else Exit.REFUSED


@cli.command(
    "backfill",
    help=(
        "Run JOB's missed, failed, released or skipped slots in [--since, --until) by hand, each under the "
        "key Scheduler's own delivery of it has, with run's retry rules. Running it again runs nothing "
        "that completed. Prints one JSON line per slot run."
    ),
)
@click.argument("job")
@click.option("--since", required=True, help="RFC 3339, e.g. 2026-11-28T00:00:00Z.")
@click.option("--until", required=True, help="RFC 3339 (exclusive).")
@click.option(
    "--only",
    default=DEFAULT_ONLY,
    show_default=True,
    help=f"Which statuses to run, some of {','.join(REOPENABLE + FORCED)} (unknown needs --force).",
)
@click.option("--force", is_flag=True, help="Run unknown slots too, although they may have run already.")
@click.option("--dry-run", is_flag=True, help="Say what would run, run nothing.")
@click.option("--concurrency", type=int, default=1, show_default=True, help="Slots run at once (1 to 16).")
@click.option(
    "--max-attempts", type=int, default=RetryPolicy.max_attempts, show_default=True, help="Per slot, as run's."
)
@click.option(
    "--deadline",
    type=float,
    default=RetryPolicy.deadline_seconds,
    metavar="SECONDS",
    show_default=True,
    help="Per slot, as run's.",
)
@click.option("--backoff", type=float, default=RetryPolicy.backoff_base_seconds, hidden=True)
@click.option(
    "--request-timeout",
    type=float,
    default=RetryPolicy.timeout_seconds,
    metavar="SECONDS",
    show_default=True,
    help="Seconds one request may take.",
)
@_with_credentials
def backfill_command(url: str, headers: dict[str, str], **options: Any) -> int:
    return backfill(Backfill(url=url, **options), headers)


CONFORMANCE_FAILED = 1  # a rule failed (Click's own usage errors stay 2)


@cli.command(
    "pause",
    help=(
        "Pause Scheduler job NAME, in the app and in Cloud Scheduler: its slots from now are paused, "
        "never missed. Sent again (a lost answer, Cloud Scheduler failing), it finishes the work."
    ),
)
@click.argument("name")
@click.option("--note", help="Why (shown with the pause; at most 500 characters).")
@click.option("--project", help="The Scheduler job's project, when several of NAME are declared.")
@click.option("--location", help="The Scheduler job's location, when several of NAME are declared.")
@_with_credentials
def pause_command(url: str, headers: dict[str, str], name: str, note: str | None, **place: str | None) -> int:
    return _set_paused(url, headers, name, "pause", {"note": note} if note else {}, place)


@cli.command(
    "resume",
    help="Resume Scheduler job NAME, in the app and in Cloud Scheduler: its slots from now are expected again.",
)
@click.argument("name")
@click.option(
    "--catch-up",
    type=click.Choice(["none", "latest", "all"]),
    default="none",
    show_default=True,
    help="Run the pause's slots that never ran: none, the latest, or all (within the job's catchup_window).",
)
@click.option("--project", help="The Scheduler job's project, when several of NAME are declared.")
@click.option("--location", help="The Scheduler job's location, when several of NAME are declared.")
@_with_credentials
def resume_command(url: str, headers: dict[str, str], name: str, catch_up: str, **place: str | None) -> int:
    return _set_paused(url, headers, name, "resume", {"catch_up": catch_up}, place)


def _set_paused(
    url: str, headers: dict[str, str], name: str, action: str, body: dict[str, str], place: dict[str, str | None]
) -> int:
    """POST .../scheduler-jobs/NAME/pause|resume, retried as a run is: both are idempotent."""
    target = f"{url.rstrip('/')}/api/v1/scheduler-jobs/{urllib.parse.quote(name, safe='')}/{action}"
    query = {key: value for key, value in place.items() if value}
    request_headers = {**headers, "Content-Type": "application/json"}
    session = requests.Session()

    def send(timeout: float) -> requests.Response:
        return session.post(
            target, params=query, data=json.dumps(body), headers=request_headers, timeout=timeout, allow_redirects=False
        )

    def on_retry(attempt: int, why: str, delay: float) -> None:
        say(f"attempt {attempt}: {why}; the same request again in {delay:.1f} s")

    try:
        outcome = run_with_retries(
            send,
            RetryPolicy(),
            on_retry=on_retry,
            is_answer=lambda answer: isinstance(answer, dict) and "paused" in answer and "scheduler_job" in answer,
        )
    except requests.RequestException as exc:
        say(f"{target}: {exc}")
        return Exit.REFUSED
    if outcome.body is not None:
        out(json.dumps(outcome.body) if not isinstance(outcome.body, str) else outcome.body)
    return outcome.exit


def _json_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None


def _json_text_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """JSON text, checked and then sent as it was given."""
    _json_option(ctx, param, value)
    return value


def _header_option(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str] | None:
    """'Name: value' lines as headers; None when none were given."""
    if not values:
        return None
    headers = {}
    for value in values:
        name, sep, text = value.partition(":")
        if not sep or not name.strip() or any(char in name for char in " \t"):
            raise click.BadParameter(f"{value!r}: give 'Header-Name: value'")
        headers[name.strip()] = text.strip()
    return headers


@cli.command(
    "conformance",
    help=(
        f"Check the idempotency-key rules against a guarded endpoint: POST BASE_URL + PATH with JSON bodies "
        f"and fresh Idempotency-Keys, judge every answer, print a table naming each rule's source "
        f"({DRAFT}, {DRAFT_DATE}; Stripe; Powertools; RFC 9457; RFC 8941). Keys are new on every run. "
        f"Exit 0 when every rule passes or does not apply, {CONFORMANCE_FAILED} when one fails."
    ),
)
@click.argument("base_url")
@click.argument("path")
@click.option(
    "--body",
    callback=_json_option,
    metavar="JSON",
    help='A JSON body the endpoint accepts (default {"item": "conformance"}).',
)
@click.option(
    "--other-body",
    callback=_json_option,
    metavar="JSON",
    help="Another accepted body that the endpoint must see as a different request (default: --body changed).",
)
@click.option(
    "--invalid-body",
    callback=_json_text_option,
    metavar="JSON",
    help="A JSON body the endpoint refuses with 400 or 422 (without it, the validation rule does not apply).",
)
@click.option(
    "--caller-a",
    multiple=True,
    callback=_header_option,
    metavar="'HEADER: VALUE'",
    help="A header saying who the first caller is (repeatable).",
)
@click.option(
    "--caller-b",
    multiple=True,
    callback=_header_option,
    metavar="'HEADER: VALUE'",
    help="A header of a second caller (repeatable; without it, the caller rule does not apply).",
)
@click.option(
    "--key-optional", is_flag=True, help="The endpoint runs without a key (the missing-key rule does not apply)."
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 600),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="One request's timeout.",
)
@click.option(
    "--concurrency", type=click.IntRange(2, 64), default=8, show_default=True, help="Same-key requests at once."
)
@click.option(
    "--audience",
    help=f"Give the first caller an ID token ({TOKEN_ENV}, else from ADC for this IAP OAuth client id).",
)
def conformance_command(
    base_url: str,
    path: str,
    body: Any,
    other_body: Any,
    invalid_body: str | None,
    caller_a: dict[str, str] | None,
    caller_b: dict[str, str] | None,
    key_optional: bool,
    timeout: float,
    concurrency: int,
    audience: str | None,
) -> int:
    first_caller = dict(caller_a or {})
    if audience:
        try:
            first_caller.update(auth_headers(audience, no_auth=False))
        except CredentialsError as exc:
            say(str(exc))
            return Exit.REFUSED
    options = Options(
        **({"body": body} if body is not None else {}),
        other_body=other_body,
        invalid_body=invalid_body,
        caller_a=first_caller,
        caller_b=caller_b,
        key_required=not key_optional,
        timeout=timeout,
        concurrency=concurrency,
    )
    results = run_suite(base_url, path, options)
    out(format_table(results, target=f"{base_url.rstrip('/')}/{path.lstrip('/')}"))
    return Exit.OK if all_passed(results) else CONFORMANCE_FAILED
