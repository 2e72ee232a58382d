"""A small English corpus for the character-level zoo cases (written here, no download).

``text()`` returns the same few kilobytes every time: short verses repeated with varied line
order (a fixed shuffle), so a tiny model has something learnable but not trivially periodic.
"""

import random

VERSES = [
    "the quick brown fox jumps over the lazy dog and runs into the wood.",
    "a bird sat on the wall and sang a song about the rain and the sun.",
    "in the morning the baker makes bread; in the evening he sleeps.",
    "she sells sea shells by the sea shore, and the shells she sells are small.",
    "two cats and one dog lived in a house at the end of a long road.",
    "when the wind blows hard, the old tree bends but does not break.",
    "he counted the stars: one, two, three, four, five, and then he slept.",
    "the river runs to the sea, and the sea runs back as rain on the hills.",
    "bring me the book from the shelf, the red one with the torn cover.",
    "we walked for hours in the snow and found the village at night.",
    "the clock struck twelve and the children ran out into the yard.",
    "every little thing she does is done with care and a quiet smile.",
]


def text(repeats: int = 12, seed: int = 1234) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(repeats):
        block = list(VERSES)
        rng.shuffle(block)
        lines.extend(block)
    return "\n".join(lines) + "\n"


def vocab(data: str) -> tuple[list[str], dict[str, int]]:
    chars = sorted(set(data))
    return chars, {c: i for i, c in enumerate(chars)}
