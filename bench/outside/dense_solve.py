"""A dense linear system with numpy.linalg (LAPACK): a random, diagonally dominant n x n matrix,
solved by LU (np.linalg.solve) against 8 right-hand sides, factored by QR (np.linalg.qr), and
the relative residuals of the solution and of the factorisation.

    python bench/outside/dense_solve.py N

LAPACK runs with one BLAS thread unless OPENBLAS_NUM_THREADS says otherwise, as a program that
shares its host with others would: a QR of a 1024 x 1024 matrix took 0.23 s with one thread
and 21 s with OpenBLAS's two (spin-waiting) at the lowest priority on a 2-CPU host busy with
other processes.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read when numpy loads OpenBLAS

import numpy as np  # noqa: E402

import counterd  # noqa: E402

RHS = 8  # right-hand sides solved at once


def main(n: int) -> None:
    rng = np.random.default_rng(11)
    with counterd.superstep("build", n=n):
        a = rng.standard_normal((n, n))
        # Each diagonal entry above its row's other entries' absolute sum: nonsingular and
        # well conditioned at every n, so that the LU needs no luck.
        a[np.diag_indices(n)] += np.abs(a).sum(axis=1)
        b = rng.standard_normal((n, RHS))
    with counterd.superstep("lu solve", n=n):
        x = np.linalg.solve(a, b)
    with counterd.superstep("qr", n=n):
        q, r = np.linalg.qr(a)
    with counterd.superstep("residual", n=n):
        solve_res = np.linalg.norm(a @ x - b) / np.linalg.norm(b)
        qr_res = np.linalg.norm(q @ r - a) / np.linalg.norm(a)
    if not (solve_res < 1e-8 and qr_res < 1e-8):
        raise SystemExit(f"dense_solve: residuals too large: {solve_res:.3g}, {qr_res:.3g}")
    print(f"residuals: solve {solve_res:.3g}, qr {qr_res:.3g}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
