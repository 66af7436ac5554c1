"""SQL with the standard library's sqlite3, in memory: a table of n sales rows inserted with
executemany, an index on its product column, a GROUP BY aggregate over products, and a join
with a small table of stores grouped by region.

    python bench/outside/sqlite_query.py N
"""

from __future__ import annotations

import random
import sqlite3
import sys

import counterd

STORES = 50
PRODUCTS = 500
REGIONS = ("north", "south", "east", "west", "centre")


def main(n: int) -> None:
    rnd = random.Random(41)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE stores (id INTEGER PRIMARY KEY, region TEXT NOT NULL)")
    db.executemany("INSERT INTO stores VALUES (?, ?)",
                   [(i, REGIONS[i % len(REGIONS)]) for i in range(STORES)])
    with counterd.superstep("insert", n=n):
        db.execute("CREATE TABLE sales (id INTEGER PRIMARY KEY, store INTEGER NOT NULL, "
                   "product INTEGER NOT NULL, qty INTEGER NOT NULL, price REAL NOT NULL)")
        db.executemany("INSERT INTO sales VALUES (?, ?, ?, ?, ?)",
                       ((i, rnd.randrange(STORES), rnd.randrange(PRODUCTS), rnd.randint(1, 9),
                         round(rnd.uniform(0.5, 99.5), 2)) for i in range(n)))
        db.commit()
    with counterd.superstep("index", n=n):
        db.execute("CREATE INDEX sales_product ON sales (product)")
    with counterd.superstep("group by", n=n):
        top = db.execute("SELECT product, COUNT(*), SUM(qty * price) FROM sales "
                         "GROUP BY product ORDER BY 3 DESC LIMIT 3").fetchall()
    with counterd.superstep("join", n=n):
        regions = db.execute("SELECT stores.region, COUNT(*), SUM(sales.qty) FROM sales "
                             "JOIN stores ON sales.store = stores.id "
                             "GROUP BY stores.region ORDER BY stores.region").fetchall()
    db.close()
    if sum(count for _, count, _ in regions) != n:
        raise SystemExit(f"sqlite_query: the join counted {regions}, not {n} rows")
    print("top products: " + ", ".join(f"{p} {s:.0f}" for p, _, s in top) + "; units by region: "
          + ", ".join(f"{r} {q}" for r, _, q in regions))


if __name__ == "__main__":
    main(int(sys.argv[1]))
