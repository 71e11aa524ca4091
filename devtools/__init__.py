"""Local tooling: the Datastore emulator and the local server (not deployed)."""
