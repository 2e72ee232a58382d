"""nanscope.report."""
