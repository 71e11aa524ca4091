"""Local tooling, not deployed: the Datastore emulator, gunicorn, the local server, the
simulations, and stand-ins for the Google APIs the app calls."""

# How often a local server looks for shutdown: the default half second, per server and test, adds up.
POLL_SECONDS = 0.02
