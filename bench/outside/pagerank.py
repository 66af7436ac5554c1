"""PageRank with scipy.sparse: a random directed graph of n nodes with about 8 edges a node, as a
column-stochastic CSR matrix (each edge j -> i weighted 1 / outdegree(j)), 30 power-iteration
steps with damping 0.85 (the rank of nodes without out-edges spread over all nodes), and the
10 nodes of highest rank.

    python bench/outside/pagerank.py N
"""

from __future__ import annotations

import sys

import numpy as np
import scipy.sparse as sp

import counterd

DEGREE = 8  # edges drawn per node (duplicates merged, self-loops kept)
STEPS = 30
DAMPING = 0.85


def main(n: int) -> None:
    rng = np.random.default_rng(21)
    with counterd.superstep("graph", n=n):
        src = rng.integers(0, n, DEGREE * n)
        dst = rng.integers(0, n, DEGREE * n)
        adj = sp.csr_matrix((np.ones(DEGREE * n), (dst, src)), shape=(n, n))
        adj.data[:] = 1.0  # an edge drawn twice counts once
    with counterd.superstep("normalise", n=n):
        out_degree = np.asarray(adj.sum(axis=0)).ravel()
        dangling = out_degree == 0
        inv = np.divide(1.0, out_degree, out=np.zeros(n), where=~dangling)
        m = (adj @ sp.diags(inv)).tocsr()  # column j scaled by 1 / outdegree(j)
    with counterd.superstep("power iteration", n=n):
        rank = np.full(n, 1.0 / n)
        for _ in range(STEPS):
            spread = DAMPING * rank[dangling].sum() / n + (1.0 - DAMPING) / n
            rank = DAMPING * (m @ rank) + spread
    with counterd.superstep("top", n=n):
        top = np.argsort(rank, kind="stable")[::-1][:10]
    if abs(rank.sum() - 1.0) > 1e-9:
        raise SystemExit(f"pagerank: ranks sum to {rank.sum():.12g}, not 1")
    print("top: " + ", ".join(f"{i} {rank[i]:.3g}" for i in top))


if __name__ == "__main__":
    main(int(sys.argv[1]))
