"""Examples: demo jobs for `make run` (and, later, an example downstream service)."""
