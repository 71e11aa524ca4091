"""dedupctl: start and read runs of a deployed app from scripts, retrying safely.

One client token per run, made once and printed before the first request,
and the same request repeated with it: however often an answer is lost, the
job runs once.  Needs only requests and google-auth (``python -m dedupctl``).
"""
