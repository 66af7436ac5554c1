"""Records through JSON with the standard library: n nested dicts serialised one per line
(json.dumps), parsed back (json.loads), filtered and summed by a field.

    python bench/outside/jsonl.py N
"""

from __future__ import annotations

import json
import random
import sys

import counterd


def main(n: int) -> None:
    rnd = random.Random(9)
    with counterd.superstep("build", n=n):
        rows = [{"id": i, "name": f"item-{i}", "tags": [rnd.choice("abcdef") for _ in range(3)],
                 "price": {"amount": round(rnd.random() * 100, 2), "currency": "EUR"}}
                for i in range(n)]
    with counterd.superstep("dumps", n=n):
        text = "\n".join(json.dumps(r) for r in rows)
    with counterd.superstep("loads", n=n):
        back = [json.loads(line) for line in text.splitlines()]
    with counterd.superstep("query", n=n):
        total = sum(r["price"]["amount"] for r in back if "a" in r["tags"])
    print(f"{total:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
