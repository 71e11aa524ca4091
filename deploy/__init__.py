"""Deployment tooling: Cloud Scheduler jobs as code, firewall rules, the TTL policy.

Run as ``python -m deploy ...`` (a Click group that never builds the web
app); each command prints the ``gcloud`` commands it would run and runs them
only with ``--apply``.
"""
