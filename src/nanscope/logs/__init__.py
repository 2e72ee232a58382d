"""nanscope.logs."""
