"""The utility layer: strict JSON and TOML readers (``strictjson``, ``stricttoml``), file
helpers (``fsutil``: atomic writes, bounded reads) and the command-line helpers every tool's
CLI shares (``cliutil``).

Any layer may import it, and so do ``predictor`` and ``microbench``. It imports nothing above
it: besides the standard library, only the data layer's typed errors. This file imports
nothing.
"""
