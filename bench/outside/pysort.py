"""Sorting with Python's library calls: n (name, age, score) records sorted by one key and by
two (operator.itemgetter), the best k by heapq.nlargest, sorted chunks merged by heapq.merge.

    python bench/outside/pysort.py N
"""

from __future__ import annotations

import heapq
import random
import sys
from operator import itemgetter

import counterd


def main(n: int) -> None:
    rnd = random.Random(8)
    with counterd.superstep("records", n=n):
        people = [(f"p{rnd.randrange(10**6):06d}", rnd.randrange(18, 90), rnd.random())
                  for _ in range(n)]
    with counterd.superstep("sort by score", n=n):
        by_score = sorted(people, key=itemgetter(2))
    with counterd.superstep("sort by age, name", n=n):
        by_age = sorted(people, key=itemgetter(1, 0))
    with counterd.superstep("nlargest", n=n):
        best = heapq.nlargest(100, people, key=itemgetter(2))
    with counterd.superstep("merge chunks", n=n):
        chunks = [sorted(people[i::8]) for i in range(8)]
        merged = list(heapq.merge(*chunks))
    print(by_score[0][0], by_age[0][0], best[0][0], merged[0][0])


if __name__ == "__main__":
    main(int(sys.argv[1]))
