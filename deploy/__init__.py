"""Deployment tooling: Cloud Scheduler jobs as code, firewall rules, the TTL policy.

Exposed as Flask CLI commands (``flask --app main ...``); each prints the
``gcloud`` commands it would run and runs them only with ``--apply``.
"""
