"""Importing counterd (or anything that imports it) has no side effects on the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, os
before = dict(os.environ)
import counterd, counterd.backends.sim, counterd.daemon, counterd.report, counterd.data.records
import microbench.runner, predictor
after_import = dict(os.environ)
counterd.configure(backend="none", socket="off")  # the first recorder: the run id is exported
print(json.dumps({"import": sorted(set(after_import.items()) ^ set(before.items())),
                  "recorder": os.environ.get("COUNTERD_RUN_ID")}))
"""


def _run(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)


def test_import_leaves_the_environment_unchanged() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env["PYTHONPATH"] = str(ROOT)
    got = _run(env)
    assert got["import"] == []
    # ...and the first recorder exports the run id, so subprocesses share it.
    assert isinstance(got["recorder"], str) and len(got["recorder"]) == 12


def test_a_given_run_id_is_kept() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env.update(PYTHONPATH=str(ROOT), COUNTERD_RUN_ID="given")
    assert _run(env) == {"import": [], "recorder": "given"}
