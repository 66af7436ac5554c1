"""The command layer: ``counterd``'s commands and their console entry (``cli``, with
``cli_options``), ``recording`` (``counterd record``), ``probe`` (with ``noise``),
``importing`` (``counterd import``) and ``cluster`` (``counterd cluster``).

The top of the house: it may import every layer below, and nothing of counterd imports it but
these modules themselves (microbench's compute patterns, a tool above counterd, use
``recording.record``). This file imports nothing.
"""
