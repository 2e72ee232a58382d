from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

from tests.compat._runs import Zygote


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()
