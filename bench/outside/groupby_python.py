"""A group-by in pure Python: n (user, item, amount) records, grouped in a dict of lists,
summed and averaged per user, the top users sorted.

    python bench/outside/groupby_python.py N
"""

from __future__ import annotations

import random
import sys

import counterd


def main(n: int) -> None:
    rnd = random.Random(6)
    with counterd.superstep("records", n=n):
        users = [f"user{i:05d}" for i in range(max(1, n // 20))]
        records = [(rnd.choice(users), rnd.randrange(500), rnd.random() * 50) for _ in range(n)]
    with counterd.superstep("group", n=n):
        groups: dict[str, list[float]] = {}
        for user, _item, amount in records:
            groups.setdefault(user, []).append(amount)
    with counterd.superstep("aggregate", n=n):
        stats = {u: (sum(a), sum(a) / len(a), len(a)) for u, a in groups.items()}
    with counterd.superstep("top", n=n):
        top = sorted(stats.items(), key=lambda kv: kv[1][0], reverse=True)[:5]
    print(", ".join(f"{u} {s[0]:.1f}" for u, s in top))


if __name__ == "__main__":
    main(int(sys.argv[1]))
