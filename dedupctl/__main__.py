"""``python -m dedupctl ...`` (dedupctl/cli.py)."""

import sys

from dedupctl.cli import main

sys.exit(main())
