"""dedupctl: start and read runs of a deployed app from scripts, retrying safely.

One client token per run, made once and printed before the first request,
and the same request repeated with it: however often an answer is lost, the
job runs once.  Needs requests and click (google-auth for ``--audience``); installed as the
console script ``dedupctl`` (pyproject.toml), or run as ``python -m dedupctl``.
"""
