"""The wire layer: the formats a program's markers, the daemon and the readers exchange.

``framing`` (the frame head and the hot-path encoders the markers import), the typed frames
(``binary_frames``, ``json_frame``, ``query_frames``, ``protocol``) and the spool file
(``spool``, read back by ``spool_reader``). The spec is docs/protocol.md.

This layer imports only the data and utility layers (``counterd.data``, ``counterd.util``,
``counterd.machine``, ``counterd._native``); the markers, the daemon, the readers and the
commands import it. This file imports nothing, so that the markers' ``framing`` costs
no more than itself.
"""
