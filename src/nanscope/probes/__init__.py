"""nanscope.probes."""
