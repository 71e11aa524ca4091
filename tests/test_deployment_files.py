"""app.yaml is the deployment contract: checked, not just shipped."""

from __future__ import annotations

import os
import re

import yaml

from jobs.config import load_jobs
from tests.support.shipped import filled_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def app_yaml() -> dict:
    with open(os.path.join(ROOT, "app.yaml")) as handle:
        return yaml.safe_load(handle)


def test_every_handler_is_admin_only_and_https_only():
    config = app_yaml()
    assert config["app_engine_apis"] is True  # `login:` needs it on second-generation runtimes
    assert config["handlers"]
    for handler in config["handlers"]:
        assert handler.get("login") == "admin", handler
        assert handler.get("secure") == "always", handler
        # A scheduler, a task queue or an API client cannot follow a login redirect.
        assert handler.get("auth_fail_action") == "unauthorized", handler


def test_runtime_is_python3_and_entrypoint_serves_main_app_with_gunicorn():
    config = app_yaml()
    assert re.fullmatch(r"python3\d+", config["runtime"])
    entrypoint = config["entrypoint"]
    assert entrypoint.startswith("gunicorn ") and entrypoint.endswith(" main:app")
    assert "--bind :$PORT" in entrypoint


def test_dedup_scaling_names_the_scaling_type_app_yaml_declares():
    """Renewals stop at the scaling type's request timeout: 600 s unless told otherwise."""
    config = app_yaml()
    declared = next((kind for kind in ("basic", "manual") if f"{kind}_scaling" in config), "automatic")
    assert config.get("env_variables", {}).get("DEDUP_SCALING", "automatic") == declared


def test_gunicorn_timeout_exceeds_every_lease(tmp_path):
    timeout = int(re.search(r"--timeout (\d+)", app_yaml()["entrypoint"]).group(1))
    jobs, _ = filled_in(tmp_path)
    longest_lease = max(job.policy.lease_seconds for job in load_jobs(str(jobs)).values())
    assert timeout > longest_lease


def test_the_waiter_bound_is_a_small_share_of_each_workers_threads():
    from handlers import max_waiters_from_environ

    config = app_yaml()
    threads = int(re.search(r"--threads (\d+)", config["entrypoint"]).group(1))
    waiters = max_waiters_from_environ(config["env_variables"])
    assert 0 < waiters <= threads // 4  # the rest of the threads stay free for everything else
