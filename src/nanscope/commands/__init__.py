"""nanscope.commands."""
