"""``counterd`` command line: thin — parse, call the library, render, return an exit code.

Exit codes: 0 ok, 1 failure, 2 bad usage or bad input (one line on stderr saying what and how
to fix it). ``record`` passes the recorded command's exit code on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

from counterd.cliutil import VersionAction, closed_pipe
from counterd.errors import BadInput, CounterdError

_T = TypeVar("_T")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="counterd", description="per-superstep memory-hierarchy counters")
    p.add_argument("--version", action=VersionAction)
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
    rec.add_argument("--cpu-features", default="auto", choices=("auto", "native", "as-counted"),
                     help="as-counted: hide from the command's run-time code dispatch (numpy, "
                     "OpenBLAS, glibc) the CPU features valgrind lacks (AVX-512), so that it "
                     "runs the code Callgrind counts; native: hide nothing (default auto: "
                     "as-counted with --backend callgrind)")
    rec.add_argument("--sample", metavar="DURATION:K", default=None,
                     help="read the counters of only 1 in K supersteps shorter than DURATION "
                     "(e.g. 50us:10), per superstep name and processor; the others' counters "
                     "are the last measured one's scaled by time, flagged 'sampled' (default: "
                     "$COUNTERD_SAMPLE, else every superstep is read)")
    rec.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


    run = sub.add_parser("run", help="the daemon, in the foreground (systemd runs it)")
    run.add_argument("--config", type=Path, default=None,
                     help="TOML config (default: built-in defaults + COUNTERD_* variables)")
    run.add_argument("--json", action="store_true", help="(accepted for symmetry; logs only)")

    runs = sub.add_parser("runs", help="your runs in the daemon's store (everyone's: root "
                          "and socket.allowed_group)")
    runs.add_argument("--store", type=Path, default=None,
                      help="read this store file directly (who may read it: root, the "
                      "daemon's user); default: ask the daemon")
    runs.add_argument("--config", type=Path, default=None,
                      help="TOML config (socket.path, store.path)")
    runs.add_argument("--uid", type=int, default=None,
                      help="only this user's runs (another's: root and socket.allowed_group)")
    runs.add_argument("--json", action="store_true", help="machine-readable output")

    im = sub.add_parser("import", help="send records a program spilled (daemon down or slow) "
                        "to the daemon, then remove the files")
    im.add_argument("paths", nargs="*", type=Path, metavar="FILE|DIR",
                    help="spill files or directories (default: $COUNTERD_SPILL, else the "
                    "default spill directory)")
    im.add_argument("--socket", type=Path, default=None,
                    help="the daemon's socket (default: $COUNTERD_SOCKET, else the default "
                    "socket)")
    im.add_argument("--store", type=Path, default=None,
                    help="write into this store instead of sending to the daemon")
    im.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for the daemon's acknowledgements (default: 30)")
    im.add_argument("--json", action="store_true", help="machine-readable output")

    rp = sub.add_parser("report", help="per-superstep report of a run (store or records file)")
    rp.add_argument("run", nargs="?", default=None, help="run id (default: the latest run)")
    rp.add_argument("--records", type=Path, default=None,
                    help="a records JSONL file (counterd record --out) instead of the store")
    rp.add_argument("--store", type=Path, default=None,
                    help="read this store file directly (who may read it: root, the daemon's "
                    "user); default: ask the daemon, which gives you your own runs")
    rp.add_argument("--uid", type=int, default=None,
                    help="the run of this user (another's: root and socket.allowed_group)")
    rp.add_argument("--config", type=Path, default=None,
                    help="TOML config (socket, store, profile)")
    rp.add_argument("--profile", default=None,
                    help="machine profile for predictions (default: config predictor.profile)")
    rp.add_argument("--format", choices=("text", "json", "csv", "html"), default=None,
                    help="output format (default: text, or from the --out suffix)")
    rp.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    rp.add_argument("--json", action="store_true", help="same as --format json")
    return p


_SUFFIX_FORMATS = {"txt": "text", "text": "text", "json": "json", "csv": "csv", "htm": "html",
                   "html": "html"}


def _report_format(out: Path | None, asked: str | None) -> str:
    """The report's format: the one asked for (--format, --json), else the --out suffix's,
    else text. A suffix that names another format, or none the report can write (r.pdf), is
    bad input rather than a file whose name lies about its content."""
    suffix = out.suffix.lstrip(".").lower() if out is not None else ""
    named = _SUFFIX_FORMATS.get(suffix)
    if suffix and named is None:
        raise BadInput(f"counterd report cannot write .{suffix} files ({out})",
                       "give --out a .txt, .json, .csv or .html name")
    if asked is not None and named is not None and named != asked:
        raise BadInput(f"--format {asked} but --out {out} names {named}",
                       "make the suffix match the format, or drop one of them")
    return asked or named or "text"


def _probe(args: argparse.Namespace) -> int:
    from counterd.probe import probe, render_text

    result = probe()
    print(json.dumps(result.to_json(), indent=2) if args.json else render_text(result))
    return 0


def _record(args: argparse.Namespace) -> int:
    from counterd.recording import record

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    events = [e.strip() for e in args.events.split(",") if e.strip()]
    result = record(cmd, out=args.out, backend=args.backend, events=events,
                    cpu_features=args.cpu_features, sample=args.sample,
                    progress=lambda m: print(f"counterd record: {m}", file=sys.stderr,
                                             flush=True))
    from counterd.records import INFO_FLAGS

    flagged = sum(1 for r in result.records if r.flags - INFO_FLAGS)
    summary = {"out": str(result.out), "records": len(result.records), "backend": result.backend,
               "flagged": flagged, "exit_code": result.exit_code}
    # On stderr, as perf stat does: stdout is the recorded command's own.
    if args.json:
        print(json.dumps(summary), file=sys.stderr)
    else:
        print(f"counterd: {summary['records']} records ({flagged} flagged) from backend "
              f"{result.backend} -> {result.out}; command exited {result.exit_code}",
              file=sys.stderr)
    return result.exit_code


def _run(args: argparse.Namespace) -> int:
    from counterd.daemon import run

    return run(args.config)


def _from_daemon_or_store(args: argparse.Namespace, from_daemon: Callable[[Path], _T],
                          from_store: Callable[[Path], _T]) -> _T:
    """``--store PATH``: read that file (who may: root, the daemon's user). Otherwise ask the
    daemon, which shows users their own runs (the store file is private); with no daemon
    running, read the configured store if this user can."""
    if args.store is not None:
        return from_store(Path(args.store))
    from counterd.daemon.config import load
    from counterd.daemon.query import DaemonUnreachable

    cfg = load(args.config)
    try:
        return from_daemon(cfg.socket_path)
    except DaemonUnreachable:
        if os.access(cfg.store_path, os.R_OK):
            return from_store(cfg.store_path)
        raise


def _runs(args: argparse.Namespace) -> int:
    from counterd.daemon import query
    from counterd.report import render_runs

    rows = _from_daemon_or_store(args, lambda sock: query.runs_via_daemon(sock, args.uid),
                                 lambda path: query.runs_from_store(path, args.uid))
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        print(render_runs(rows))
    return 0


def _import(args: argparse.Namespace) -> int:
    import os

    from counterd.env import ENV_SOCKET
    from counterd.markers.spill import import_files

    sock = args.socket
    if sock is None and args.store is None and os.environ.get(ENV_SOCKET) not in (None, "", "off"):
        sock = Path(os.environ[ENV_SOCKET])
    result = import_files(args.paths, socket=sock, store=args.store, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(f"counterd import: {result.records} records imported, {len(result.removed)} "
              f"files removed, {len(result.kept)} kept")
        for path, why in result.kept.items():
            print(f"  kept {path}: {why}")
    return 1 if result.kept else 0


def _report(args: argparse.Namespace) -> int:
    from counterd import prediction, report
    from counterd.fsutil import atomic_write_text

    fmt = _report_format(args.out, "json" if args.json else args.format)
    if args.records is not None and (args.run or args.store or args.uid is not None):
        raise BadInput("--records reads a file; a RUN, --uid or --store reads the store",
                       "give one or the other")
    profile = args.profile
    if profile is None and (args.config is not None or args.records is None):
        from counterd.daemon.config import load

        profile = load(args.config).profile
    predict, why = prediction.load(
        profile, warn=lambda m: print(f"counterd report: warning: {m}", file=sys.stderr))
    if args.profile is not None and predict is None:
        raise BadInput(why, "give a profile file (predict calibrate --out) or a built-in name")
    if args.records is not None:
        from counterd.records import SuperstepRecord, read_jsonl

        records: Iterable[SuperstepRecord] = read_jsonl(args.records)  # streamed into build
        source = str(args.records)
    else:
        from counterd.daemon import query

        records, source = _from_daemon_or_store(
            args, lambda sock: query.records_via_daemon(sock, args.run, args.uid),
            lambda path: query.records_from_store(path, args.run, args.uid))
    rep = report.build(records, predict=predict, prediction_note=why, source=source)
    text = report.render(rep, fmt)
    if args.out is not None:
        atomic_write_text(args.out, text)
        print(f"counterd report: wrote {args.out} ({fmt})", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        command = {"probe": _probe, "record": _record, "run": _run, "runs": _runs,
                   "report": _report, "import": _import}[args.command]
        if args.command not in ("probe", "record") or (args.command == "record"
                                                        and args.machine is None):
            # record checks COUNTERD_MACHINE itself before the command runs, and loads
            # counterd.machine only when a file is named: it is not on the way to the exec.
            return command(args)
        from counterd.machine import using

        with using(args.machine):  # a bad machine file is BadInput here, before anything runs
            return command(args)
    except CounterdError as exc:
        print(f"counterd {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return closed_pipe()


if __name__ == "__main__":
    sys.exit(main())
