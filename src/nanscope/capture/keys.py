"""The names under which a batch holds its inputs and its targets (one list for every adapter).

A dict batch (``{"input_ids": ..., "labels": ...}``) or a model called with keywords is read with
these, first match wins: the torch adapter's forward hook and the trainer callbacks
(:func:`nanscope.integrations.split_batch`) use the same tuples in the same order.
"""

from __future__ import annotations

__all__ = ["INPUT_KEYS", "TARGET_KEYS"]

#: keys read as the batch's inputs
INPUT_KEYS = ("input", "inputs", "x", "input_ids", "pixel_values", "inputs_embeds", "features")
#: keys read as the batch's targets
TARGET_KEYS = ("labels", "label", "target", "targets", "y")
