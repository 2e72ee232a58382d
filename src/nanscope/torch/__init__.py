"""nanscope.torch."""
