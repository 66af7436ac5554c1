"""``counterd`` command line: thin — parse, call the library, render, return an exit code.

Exit codes: 0 ok, 1 failure, 2 bad usage or bad input (one line on stderr saying what and how
to fix it). ``record`` passes the recorded command's exit code on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from counterd.errors import CounterdError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="counterd", description="per-superstep memory-hierarchy counters")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pr = sub.add_parser("probe", help="which counters and backends work on this host, and why not")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.add_argument("--machine", metavar="FILE", type=Path, default=None,
                    help="machine description (TOML, see counterd/machine.py) instead of sysfs "
                    "(default: $COUNTERD_MACHINE)")

    rec = sub.add_parser("record", help="run a command with superstep markers active")
    rec.add_argument("--backend", default="auto",
                     help="auto, perf, papi, sim, callgrind or none (default: auto)")
    rec.add_argument("--events", default="",
                     help="comma-separated canonical counters: only these are recorded; one "
                     "the backend cannot give here is an error (default: all it supports)")
    rec.add_argument("--out", required=True, type=Path, help="records as JSON lines")
    rec.add_argument("--json", action="store_true", help="print a JSON summary")
    rec.add_argument("--machine", metavar="FILE", type=Path, default=None,
                     help="machine description for the simulating backends (TOML, see "
                     "counterd/machine.py) instead of sysfs (default: $COUNTERD_MACHINE)")
    rec.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


    run = sub.add_parser("run", help="the daemon, in the foreground (systemd runs it)")
    run.add_argument("--config", type=Path, default=None,
                     help="TOML config (default: built-in defaults + COUNTERD_* variables)")
    run.add_argument("--json", action="store_true", help="(accepted for symmetry; logs only)")

    runs = sub.add_parser("runs", help="the runs in the daemon's store")
    runs.add_argument("--store", type=Path, default=None, help="store path (default: config)")
    runs.add_argument("--config", type=Path, default=None, help="TOML config (for store.path)")
    runs.add_argument("--json", action="store_true", help="machine-readable output")

    rp = sub.add_parser("report", help="per-superstep report of a run (store or records file)")
    rp.add_argument("run", nargs="?", default=None, help="run id (default: the latest run)")
    rp.add_argument("--records", type=Path, default=None,
                    help="a records JSONL file (counterd record --out) instead of the store")
    rp.add_argument("--store", type=Path, default=None, help="store path (default: config)")
    rp.add_argument("--config", type=Path, default=None, help="TOML config (store, profile)")
    rp.add_argument("--profile", default=None,
                    help="machine profile for predictions (default: config predictor.profile)")
    rp.add_argument("--format", choices=("text", "json", "csv", "html"), default=None,
                    help="output format (default: text, or from the --out suffix)")
    rp.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    rp.add_argument("--json", action="store_true", help="same as --format json")
    return p


def _probe(args: argparse.Namespace) -> int:
    from counterd.probe import probe, render_text

    result = probe()
    print(json.dumps(result.to_json(), indent=2) if args.json else render_text(result))
    return 0


def _record(args: argparse.Namespace) -> int:
    from counterd.recording import record

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    events = [e.strip() for e in args.events.split(",") if e.strip()]
    result = record(cmd, out=args.out, backend=args.backend, events=events)
    from counterd.records import INFO_FLAGS

    flagged = sum(1 for r in result.records if r.flags - INFO_FLAGS)
    summary = {"out": str(result.out), "records": len(result.records), "backend": result.backend,
               "flagged": flagged, "exit_code": result.exit_code}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"counterd: {summary['records']} records ({flagged} flagged) from backend "
              f"{result.backend} -> {result.out}; command exited {result.exit_code}",
              file=sys.stderr)
    return result.exit_code


def _run(args: argparse.Namespace) -> int:
    from counterd.daemon import run

    return run(args.config)


def _store_path(args: argparse.Namespace) -> Path:
    if args.store is not None:
        return Path(args.store)
    from counterd.daemon.config import load

    return load(args.config).store_path


def _runs(args: argparse.Namespace) -> int:
    from counterd.daemon.store import open_readonly
    from counterd.report import render_runs

    store = open_readonly(_store_path(args))
    try:
        rows = store.runs()
    finally:
        store.close()
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        print(render_runs(rows))
    return 0


def _report(args: argparse.Namespace) -> int:
    from counterd import prediction, report
    from counterd.errors import BadInput
    from counterd.fsutil import atomic_write_text

    fmt = "json" if args.json else args.format
    if fmt is None:
        suffix = args.out.suffix.lstrip(".").lower() if args.out else ""
        fmt = {"htm": "html", "html": "html", "csv": "csv", "json": "json"}.get(suffix, "text")
    if args.records is not None and (args.run or args.store):
        raise BadInput("--records reads a file; a RUN or --store reads the store",
                       "give one or the other")
    profile = args.profile
    if profile is None and (args.config is not None or args.records is None):
        from counterd.daemon.config import load

        profile = load(args.config).profile
    predict, why = prediction.load(profile)
    if args.profile is not None and predict is None:
        raise BadInput(why, "give a profile file (predict calibrate --out) or a built-in name")
    if args.records is not None:
        from counterd.records import read_jsonl

        records = list(read_jsonl(args.records))
        source = str(args.records)
    else:
        records, source = report.records_from_store(_store_path(args), args.run)
    rep = report.build(records, predict=predict, prediction_note=why, source=source)
    text = report.render(rep, fmt)
    if args.out is not None:
        atomic_write_text(args.out, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        command = {"probe": _probe, "record": _record, "run": _run,
                   "runs": _runs, "report": _report}[args.command]
        if args.command not in ("probe", "record"):
            return command(args)
        from counterd.machine import using

        with using(args.machine):  # a bad machine file is BadInput here, before anything runs
            return command(args)
    except CounterdError as exc:
        print(f"counterd {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
