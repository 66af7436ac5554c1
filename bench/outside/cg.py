"""The 2-D Poisson equation on an m x m grid (n = m * m unknowns) with scipy's conjugate
gradients (scipy.sparse.linalg.cg), 60 iterations.

    python bench/outside/cg.py N
"""

from __future__ import annotations

import math
import sys

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import cg

import counterd


def main(n: int) -> None:
    m = max(2, math.isqrt(n))
    with counterd.superstep("assemble", n=n):
        t = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m))
        eye = sp.identity(m)
        a = (sp.kron(t, eye) + sp.kron(eye, t)).tocsr()
        b = np.ones(m * m)
    with counterd.superstep("cg", n=n):
        x, _ = cg(a, b, maxiter=60, rtol=1e-12)
    with counterd.superstep("residual", n=n):
        r = np.linalg.norm(b - a @ x) / np.linalg.norm(b)
    print(f"relative residual {r:.3g}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
