"""Extra-P's forecasts for ``bench/pilot_forecast.py``, run by the Python of a separate venv
that has the ``extrap`` package (4.2.5): Extra-P pins its own numpy and Qt, so it is a bench
dependency, never one of the project's.

    .extrap-venv/bin/python bench/_extrap_forecast.py IN.jsonl TARGET... > OUT.json

IN.jsonl is Extra-P's JSON-lines input: one measurement per line,
``{"params": {"n": size}, "callpath": "superstep", "metric": "time", "value": seconds}``.
Every callpath is modelled with Extra-P's default single-parameter modeler and its default
measure (the mean of the repetitions); the output maps each callpath to its model and its
value at every target: ``{callpath: {"model": str, "at": {target: seconds}}}``.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from extrap.fileio.file_reader.jsonlines_file_reader import read_jsonlines_file
    from extrap.modelers.model_generator import ModelGenerator

    path, targets = argv[0], [float(t) for t in argv[1:]]
    experiment = read_jsonlines_file(path)
    generator = ModelGenerator(experiment)  # the "Default" modeler
    generator.model_all()
    out = {}
    for (callpath, _metric), model in generator.models.items():
        fn = model.hypothesis.function
        out[callpath.name] = {"model": fn.to_string(*experiment.parameters),
                              "at": {f"{t:g}": float(fn.evaluate(t)) for t in targets}}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
