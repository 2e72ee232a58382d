"""The core commands: run, diagnose, demo (each ``main(argv) -> int``)."""
