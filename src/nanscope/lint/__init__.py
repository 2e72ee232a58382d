"""nanscope.lint."""
