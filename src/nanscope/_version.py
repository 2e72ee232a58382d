"""The package's version, in a leaf module: the report and the SARIF writer stamp it without
importing the package root, which imports them."""

__version__ = "0.1.0"
