"""Nearest neighbours with scipy.spatial.cKDTree: n random points in 3-D, the tree, the 4
nearest neighbours of n/4 query points.

    python bench/outside/kdtree.py N
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.spatial import cKDTree

import counterd


def main(n: int) -> None:
    rng = np.random.default_rng(4)
    with counterd.superstep("points", n=n):
        pts = rng.random((n, 3))
        queries = rng.random((max(1, n // 4), 3))
    with counterd.superstep("build", n=n):
        tree = cKDTree(pts)
    with counterd.superstep("query", n=n):
        d, _ = tree.query(queries, k=4)
    print(f"mean 4th-neighbour distance {d[:, -1].mean():.4g}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
