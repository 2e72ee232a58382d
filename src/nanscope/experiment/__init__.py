"""nanscope.experiment."""
