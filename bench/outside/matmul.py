"""Dense matrix product with numpy (BLAS): two random n x n matrices, their product, a norm.

    python bench/outside/matmul.py N
"""

from __future__ import annotations

import sys

import numpy as np

import counterd


def main(n: int) -> None:
    rng = np.random.default_rng(1)
    with counterd.superstep("fill", n=n):
        a = rng.standard_normal((n, n))
        b = rng.standard_normal((n, n))
    with counterd.superstep("matmul", n=n):
        c = a @ b
    with counterd.superstep("norm", n=n):
        print(f"|AB| = {np.linalg.norm(c):.6g}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
