"""``python -m nanscope`` is the ``nanscope`` command (also ``torchrun -m nanscope ...``)."""

from nanscope.cli import entry

entry()
