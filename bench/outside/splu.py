"""A sparse direct solver: the 2-D Poisson matrix of n unknowns factorised with SuperLU
(scipy.sparse.linalg.splu), then solved for 8 right-hand sides.

    python bench/outside/splu.py N
"""

from __future__ import annotations

import math
import sys

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

import counterd


def main(n: int) -> None:
    m = max(2, math.isqrt(n))
    with counterd.superstep("assemble", n=n):
        t = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(m, m))
        off = sp.diags([-1.0, -1.0], [-1, 1], shape=(m, m))
        a = (sp.kron(sp.identity(m), t) + sp.kron(off, sp.identity(m))).tocsc()
    with counterd.superstep("factorize", n=n):
        lu = splu(a)
    with counterd.superstep("solve", n=n):
        x = lu.solve(np.ones((m * m, 8)))
    print(f"x max {x.max():.6g}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
