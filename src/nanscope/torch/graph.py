"""A loss's autograd graph read without running it: the parameters it accumulates gradients into.

A loop that updates its weights by hand (no ``torch.optim``) has no parameter list to read: the
autowatch finds the weights it watches here, and the sweep's learning-rate patch the weights whose
gradients it scales. Imports no torch: it reads the graph's nodes by their attributes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_NODES", "leaves"]

#: graph nodes walked at the most to find the leaves a loss reaches
MAX_NODES = 100_000


def leaves(grad_fn: Any, limit: int = MAX_NODES) -> list[Any]:
    """The leaf tensors (parameters) a loss's autograd graph accumulates gradients into."""
    seen: set[int] = set()
    found: list[Any] = []
    stack = [grad_fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            found.append(variable)
            continue
        for child, _ in getattr(node, "next_functions", ()):
            if child is not None:
                stack.append(child)
    found.reverse()  # roughly the order the script made them
    return found
