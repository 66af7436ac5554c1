"""A pandas group-by: n sales rows (store, product, quantity, price), revenue per store and
product, joined with the stores' regions, the regions ranked.

    python bench/outside/groupby_pandas.py N
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import counterd


def main(n: int) -> None:
    rng = np.random.default_rng(5)
    with counterd.superstep("frame", n=n):
        sales = pd.DataFrame({"store": rng.integers(0, 200, n),
                              "product": rng.integers(0, 1000, n),
                              "qty": rng.integers(1, 10, n),
                              "price": rng.random(n) * 100})
        stores = pd.DataFrame({"store": np.arange(200),
                               "region": [f"region-{i % 7}" for i in range(200)]})
    with counterd.superstep("groupby", n=n):
        sales["revenue"] = sales["qty"] * sales["price"]
        per = sales.groupby(["store", "product"], as_index=False)["revenue"].sum()
    with counterd.superstep("merge", n=n):
        joined = per.merge(stores, on="store")
    with counterd.superstep("rank", n=n):
        top = joined.groupby("region")["revenue"].agg(["sum", "mean", "count"])
        top = top.sort_values("sum", ascending=False)
    print(top.head(3).to_string())


if __name__ == "__main__":
    main(int(sys.argv[1]))
