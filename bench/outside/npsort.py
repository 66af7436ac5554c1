"""Sorting with numpy: sort n keys, an argsort of records by a second key, binary searches.

    python bench/outside/npsort.py N
"""

from __future__ import annotations

import sys

import numpy as np

import counterd


def main(n: int) -> None:
    rng = np.random.default_rng(3)
    with counterd.superstep("generate", n=n):
        keys = rng.integers(0, 1 << 40, n)
        prices = rng.random(n)
    with counterd.superstep("sort", n=n):
        s = np.sort(keys)
    with counterd.superstep("argsort", n=n):
        order = np.argsort(prices, kind="stable")
        ranked = keys[order]
    with counterd.superstep("searchsorted", n=n):
        hits = np.searchsorted(s, ranked[: n // 2])
    print(int(hits.sum() % 1000))


if __name__ == "__main__":
    main(int(sys.argv[1]))
