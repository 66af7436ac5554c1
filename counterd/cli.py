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

    rec = sub.add_parser("record", help="run a command with superstep markers active")
    rec.add_argument("--backend", default="auto",
                     help="auto, perf, papi, sim, callgrind or none (default: auto)")
    rec.add_argument("--events", default="",
                     help="comma-separated canonical counters (default: all the backend supports)")
    rec.add_argument("--out", required=True, type=Path, help="records as JSON lines")
    rec.add_argument("--json", action="store_true", help="print a JSON summary")
    rec.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    sm = sub.add_parser("summary", help="per-superstep table of a records file")
    sm.add_argument("file", type=Path, help="JSON lines written by counterd record")
    sm.add_argument("--json", action="store_true", help="machine-readable output")
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


def _summary(args: argparse.Namespace) -> int:
    from counterd.records import read_jsonl
    from counterd.summary import render, summarize

    summaries = summarize(read_jsonl(args.file))
    if args.json:
        print(json.dumps([{**s.__dict__, "flags": sorted(s.flags)} for s in summaries], indent=2))
    else:
        print(render(summaries))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        command = {"probe": _probe, "record": _record, "summary": _summary}[args.command]
        return command(args)
    except CounterdError as exc:
        print(f"counterd {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
