"""nanscope.integrations."""
