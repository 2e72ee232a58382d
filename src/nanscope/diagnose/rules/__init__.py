"""nanscope.diagnose.rules."""
