"""Programs written without this project's models in mind, for ``bench/outside_suite.py``.

Each is a plain script ``python bench/outside/NAME.py N`` (N its input size) whose phases are
marked with ``counterd.superstep`` as a user would mark them, and nothing else of counterd's.
"""
