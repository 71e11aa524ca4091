"""Helpers the tests share."""

# How often a test server looks for shutdown: the default half second, per server and test, adds up.
POLL_SECONDS = 0.02
