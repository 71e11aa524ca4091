"""``python -m deploy ...``: the ops commands (deploy/cli.py)."""

from deploy.cli import cli

cli(prog_name="python -m deploy")
