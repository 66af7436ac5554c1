"""The data layer: the contracts every other layer, ``predictor`` and ``microbench`` may import.

``events`` (canonical counter names), ``records`` (SuperstepRecord and its JSON lines),
``errors`` (typed, picklable errors), ``units`` (how a quantity is written), ``env`` (the
COUNTERD_* environment names), ``jobid`` and ``clocks`` (a job's run id, a node's clock domain),
``host`` (what this host is: CPU, kernel, PMU exposure). The machine description has its own
package beside it, ``counterd.machine``.

It imports nothing above it: besides the standard library, only ``counterd.util`` and
``counterd.machine``. This file imports nothing.
"""
