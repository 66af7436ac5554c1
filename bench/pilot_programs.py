"""Programs this project does not ship, for trying pilot forecasts beyond the BSP sorts.

Each is a plain numpy/scipy computation of input size n, with every phase inside a
``counterd.superstep`` marker; nothing in it was written for, or tuned to, the forecast:

    fft      generate n random doubles; real FFT; inverse FFT; power spectrum
    dense    an n x n matrix: fill; product with a second one; solve a linear system; norms
    sparse   an n x n sparse matrix with 8 random non-zeros per row, symmetrised: build (COO to
             CSR); 20 sparse matrix-vector products; 30 conjugate-gradient iterations
    stats    n random integers: sort; unique with counts; histogram of 256 bins; cumulative sum

    python bench/pilot_programs.py PROGRAM N
    predict --pilot 'python bench/pilot_programs.py fft {n}' --sizes ... --target ...
"""

from __future__ import annotations

import sys

import numpy as np

import counterd

PROGRAMS = ("fft", "dense", "sparse", "stats")


def fft(n: int) -> None:
    rng = np.random.default_rng(0)
    with counterd.superstep("generate", n=n):
        x = rng.random(n)
    with counterd.superstep("rfft", n=n):
        f = np.fft.rfft(x)
    with counterd.superstep("irfft", n=n):
        y = np.fft.irfft(f, n)
    with counterd.superstep("power spectrum", n=n):
        float(np.sum(np.abs(f) ** 2)) + float(y[0])


def dense(n: int) -> None:
    rng = np.random.default_rng(0)
    with counterd.superstep("fill", n=n):
        a = rng.random((n, n)) + n * np.eye(n)
        b = rng.random((n, n))
    with counterd.superstep("matmul", n=n):
        c = a @ b
    with counterd.superstep("solve", n=n):
        x = np.linalg.solve(a, c[:, 0])
    with counterd.superstep("norms", n=n):
        float(np.linalg.norm(c)) + float(np.linalg.norm(x))


def sparse(n: int) -> None:
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    k = 8
    with counterd.superstep("build", n=n):
        rows = np.repeat(np.arange(n), k)
        cols = rng.integers(0, n, n * k)
        vals = rng.random(n * k)
        a = sp.coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
        a = a + a.T + sp.identity(n, format="csr") * (4.0 * k)
    x = rng.random(n)
    with counterd.superstep("spmv", n=n):
        y = x
        for _ in range(20):
            y = a @ y
            y /= np.abs(y).max()
    with counterd.superstep("cg", n=n):
        from scipy.sparse.linalg import cg

        cg(a, x, maxiter=30, rtol=1e-30)


def stats(n: int) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, max(n // 4, 1), n)
    with counterd.superstep("sort", n=n):
        s = np.sort(data)
    with counterd.superstep("unique", n=n):
        np.unique(data, return_counts=True)
    with counterd.superstep("histogram", n=n):
        np.histogram(data, bins=256)
    with counterd.superstep("cumsum", n=n):
        float(np.cumsum(s)[-1])


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in PROGRAMS or not argv[1].isdecimal():
        print(f"usage: pilot_programs.py {{{','.join(PROGRAMS)}}} N", file=sys.stderr)
        return 2
    globals()[argv[0]](int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
