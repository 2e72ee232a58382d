"""Capture: turn what the user has into per-update records."""
