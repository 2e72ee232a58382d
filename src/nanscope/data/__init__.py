"""nanscope.data."""
