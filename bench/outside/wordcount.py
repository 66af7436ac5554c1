"""Word frequencies of a generated text of n words: str methods, str.translate, a Counter,
the report formatted with f-strings.

    python bench/outside/wordcount.py N
"""

from __future__ import annotations

import random
import string
import sys
from collections import Counter

import counterd


def main(n: int) -> None:
    rnd = random.Random(7)
    vocab = ["".join(rnd.choices(string.ascii_letters, k=rnd.randint(2, 9))) for _ in range(5000)]
    with counterd.superstep("text", n=n):
        words = rnd.choices(vocab, k=n)
        text = " ".join(w + rnd.choice(",.;: ") for w in words)
    with counterd.superstep("normalize", n=n):
        clean = text.lower().translate(str.maketrans("", "", string.punctuation))
    with counterd.superstep("count", n=n):
        counts = Counter(clean.split())
    with counterd.superstep("report", n=n):
        lines = [f"{w:<12}{c:>8}" for w, c in counts.most_common()]
        report = "\n".join(lines)
    print(report[:60].replace("\n", " | "))


if __name__ == "__main__":
    main(int(sys.argv[1]))
