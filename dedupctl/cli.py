"""``python -m dedupctl run JOB --url BASE ...``, ``runs list``, ``runs show RUN_ID``, ``backfill JOB``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
import uuid
from typing import Any

import requests

from dedupctl.backfill import add_parser as add_backfill_parser
from dedupctl.backfill import backfill
from dedupctl.client import Exit, RetryPolicy, run_with_retries

TOKEN_ENV = "DEDUPCTL_ID_TOKEN"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        headers = _auth_headers(args)
    except CredentialsError as exc:
        print(f"dedupctl: {exc}", file=sys.stderr)
        return Exit.REFUSED
    if args.command == "run":
        return _run(args, headers)
    if args.command == "backfill":
        return backfill(args, headers)
    return _read_runs(args, headers)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dedupctl", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", required=True, help="the app's base URL, e.g. https://PROJECT.appspot.com")
    common.add_argument("--audience", help="the IAP OAuth client id to get an ID token for (service accounts, ADC)")
    common.add_argument("--no-auth", action="store_true", help="send no credentials (make run)")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", parents=[common], help="start a run of JOB, once, retrying safely")
    run.add_argument("job")
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="a string parameter")
    run.add_argument("--parameters-json", help="the parameters as a JSON object (--param adds to it)")
    run.add_argument("--token", help="the client token (default: a new UUID4, printed to stderr first)")
    run.add_argument("--wait", type=_bounded(int, 0, 60), default=0, metavar="SECONDS", help="Prefer: wait=N (0-60)")
    run.add_argument("--max-attempts", type=_bounded(int, 1, 1000), default=RetryPolicy.max_attempts)
    run.add_argument(
        "--deadline", type=_bounded(float, 1, 86400), default=RetryPolicy.deadline_seconds, metavar="SECONDS"
    )
    run.add_argument(
        "--backoff", type=_bounded(float, 0.001, 60), default=RetryPolicy.backoff_base_seconds, help=argparse.SUPPRESS
    )

    runs = commands.add_parser("runs", help="read runs")
    reads = runs.add_subparsers(dest="read", required=True)
    listing = reads.add_parser("list", parents=[common])
    listing.add_argument("--job")
    listing.add_argument("--status")
    listing.add_argument("--limit", type=int)
    show = reads.add_parser("show", parents=[common])
    show.add_argument("run_id")
    add_backfill_parser(commands, common)
    return parser


def _bounded(kind: type, low: float, high: float):
    def parse(text: str):
        value = kind(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text}: must be from {low} to {high}")
        return value

    return parse


class CredentialsError(Exception):
    pass


def _auth_headers(args: argparse.Namespace) -> dict[str, str]:
    """Authorization: Bearer <ID token> from DEDUPCTL_ID_TOKEN, or from ADC for --audience."""
    if args.no_auth:
        return {}
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        if not args.audience:
            raise CredentialsError(f"give --audience (the IAP OAuth client id), set {TOKEN_ENV}, or --no-auth")
        import google.auth.exceptions
        import google.auth.transport.requests
        import google.oauth2.id_token

        try:
            token = google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), args.audience)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise CredentialsError(f"no ID token for {args.audience}: {exc}") from None
    return {"Authorization": f"Bearer {token}"}


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    if args.parameters_json:
        parameters = json.loads(args.parameters_json)
        if not isinstance(parameters, dict):
            raise ValueError("--parameters-json must be a JSON object")
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {item!r}: give KEY=VALUE")
        parameters[key] = value
    return parameters


def _run(args: argparse.Namespace, headers: dict[str, str]) -> int:
    try:
        parameters = _parameters(args)
    except ValueError as exc:
        print(f"dedupctl: {exc}", file=sys.stderr)
        return Exit.REFUSED
    token = args.token or str(uuid.uuid4())
    # Before the first request: a script killed from here on can resume the same run.
    print(f"dedupctl: clientToken {token} (resume with --token {token})", file=sys.stderr, flush=True)
    url = f"{args.url.rstrip('/')}/api/v1/jobs/{urllib.parse.quote(args.job, safe='')}/runs"
    body = {"clientToken": token, "parameters": parameters}
    request_headers = {**headers, "Content-Type": "application/json"}
    if args.wait:
        request_headers["Prefer"] = f"wait={args.wait}"
    policy = RetryPolicy(args.max_attempts, args.deadline, args.backoff)
    session = requests.Session()

    def send(timeout: float) -> requests.Response:
        # No redirects: a POST turned into a GET (a sign-in page, http -> https) is not a run.
        return session.post(url, data=json.dumps(body), headers=request_headers, timeout=timeout, allow_redirects=False)

    def on_retry(attempt: int, why: str, delay: float) -> None:
        print(f"dedupctl: attempt {attempt}: {why}; the same request again in {delay:.1f} s", file=sys.stderr)

    try:
        outcome = run_with_retries(send, policy, on_retry=on_retry)
    except requests.RequestException as exc:  # a bad URL, too many redirects: not the network's fault
        print(f"dedupctl: {url}: {exc}; resume with --token {token}", file=sys.stderr)
        return Exit.REFUSED
    if outcome.body is not None:
        print(json.dumps(outcome.body) if not isinstance(outcome.body, str) else outcome.body)
    if outcome.exit == Exit.GAVE_UP:
        print(f"dedupctl: gave up after {outcome.attempts} attempt(s); resume with --token {token}", file=sys.stderr)
    return outcome.exit


def _read_runs(args: argparse.Namespace, headers: dict[str, str]) -> int:
    base = f"{args.url.rstrip('/')}/api/v1/runs"
    if args.read == "show":
        url, query = f"{base}/{urllib.parse.quote(args.run_id, safe='')}", {}
    else:
        url = base
        query = {name: value for name in ("job", "status", "limit") if (value := getattr(args, name)) is not None}
    try:
        response = requests.get(
            url, params=query, headers=headers, timeout=RetryPolicy.timeout_seconds, allow_redirects=False
        )
    except requests.RequestException as exc:
        print(f"dedupctl: {url}: {exc}", file=sys.stderr)
        return Exit.GAVE_UP
    print(response.text.rstrip())
    if response.status_code >= 500:
        return Exit.GAVE_UP  # the app or its front end failed: try again later
    return Exit.OK if response.status_code in (200, 201) else Exit.REFUSED
