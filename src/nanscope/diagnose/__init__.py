"""nanscope.diagnose."""
