"""Low-pass filtering a noisy signal of n samples with numpy's FFT.

    python bench/outside/lowpass.py N
"""

from __future__ import annotations

import sys

import numpy as np

import counterd


def main(n: int) -> None:
    rng = np.random.default_rng(2)
    with counterd.superstep("signal", n=n):
        t = np.linspace(0.0, 1.0, n, endpoint=False)
        x = np.sin(2 * np.pi * 50 * t) + 0.5 * rng.standard_normal(n)
    with counterd.superstep("rfft", n=n):
        f = np.fft.rfft(x)
    with counterd.superstep("filter", n=n):
        f[len(f) // 10:] = 0
    with counterd.superstep("irfft", n=n):
        y = np.fft.irfft(f, n)
    print(f"rms {np.sqrt(np.mean(y * y)):.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
