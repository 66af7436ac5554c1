"""A graph in pure Python: a random undirected graph of n nodes and 4n edges
(random.Random) as adjacency lists in a dict of lists, a breadth-first search from node 0
(collections.deque), its connected components by union-find (path halving, union by size),
its degree histogram and a neighbour's mean degree.

    python bench/outside/bfs_python.py N
"""

from __future__ import annotations

import random
import sys
from collections import Counter, deque

import counterd


def main(n: int) -> None:
    rnd = random.Random(31)
    with counterd.superstep("build", n=n):
        edges = [(rnd.randrange(n), rnd.randrange(n)) for _ in range(4 * n)]
        adj: dict[int, list[int]] = {v: [] for v in range(n)}
        for u, v in edges:
            adj[u].append(v)
            adj[v].append(u)
    with counterd.superstep("bfs", n=n):
        depth = {0: 0}
        queue = deque([0])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in depth:
                    depth[v] = depth[u] + 1
                    queue.append(v)
    with counterd.superstep("components", n=n):
        parent = list(range(n))
        size = [1] * n

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for u, v in edges:
            ru, rv = find(u), find(v)
            if ru != rv:
                if size[ru] < size[rv]:
                    ru, rv = rv, ru
                parent[rv] = ru
                size[ru] += size[rv]
        components = sum(1 for v in range(n) if parent[v] == v)
    with counterd.superstep("degrees", n=n):
        degree = {v: len(vs) for v, vs in adj.items()}
        histogram = Counter(degree.values())
        # A neighbour's mean degree (above the mean degree: the friendship paradox).
        neighbours = sum(degree[v] for vs in adj.values() for v in vs) / max(1, 2 * len(edges))
    giant = size[find(0)]
    if giant != len(depth):
        raise SystemExit(f"bfs_python: bfs reached {len(depth)} nodes, union-find {giant}")
    print(f"reached {len(depth)} nodes in {max(depth.values())} levels; {components} components;"
          f" most common degree {histogram.most_common(1)[0][0]}, a neighbour's {neighbours:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
