"""The counterd service: lifecycle, the marker socket and its sessions, the store, the Prometheus
exporter, the sampler and the configuration. ``counterd run`` calls :func:`run`.

Importing the package loads nothing else; the modules are imported where used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def run(config_path: Path | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM; the exit code (see service.run)."""
    from counterd.daemon.service import run as _run

    return _run(config_path, env=env)


__all__ = ["run"]
