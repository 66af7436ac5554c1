"""``counterd`` command line: thin — parse, call the library, render, return an exit code.

Exit codes: 0 ok, 1 failure, 2 bad usage or bad input (one line on stderr saying what and how
to fix it). ``record`` passes the recorded command's exit code on.

Loading this module loads only os, sys and the errors. ``counterd record`` in its plain form
(options, ``--``, the command) is read without argparse (:func:`_plain_record`), so that the
command starts before argparse, pathlib and json, with re under them, are loaded (10-12 ms on
this kind of host); every other command line goes through argparse
(:func:`counterd.commands.cli_options.parser`), and each command imports what it uses.
"""

from __future__ import annotations

import os
import sys

from counterd.data.errors import BadInput, CounterdError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path
    from typing import NoReturn, TypeVar

    _T = TypeVar("_T")


# ``counterd record``'s options as counterd.commands.cli_options gives them to argparse (tests
# check that the two agree): those taking a value, with their defaults, and the flags.
_RECORD_VALUES = {"--backend": "auto", "--events": "", "--out": None, "--machine": None,
                  "--cpu-features": "auto", "--sample": None}
_RECORD_FLAGS = ("--json", "--prefetch", "--count-from-start")


def _plain_record(argv: Sequence[str]) -> argparse.Namespace | None:
    """``counterd record``'s arguments read without argparse, when ``argv`` is in the plain
    form: ``record``, options spelt out in full (``--out F`` or ``--out=F``, each at most
    once, no value starting with ``-``), ``--out`` among them, ``--``, a command. Any other
    form (help, an abbreviation, a mistake) is None: argparse reads it, and says what is
    wrong. The result is what argparse gives, but ``out`` and ``machine`` are strings."""
    from types import SimpleNamespace

    from counterd.commands.recording import CPU_FEATURES

    if argv[:1] != ["record"] or "--" not in argv:
        return None
    end = argv.index("--")
    if end == len(argv) - 1:
        return None
    given: dict[str, object] = {}
    rest = list(argv[1:end])
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name in _RECORD_FLAGS and not eq:
            value_of: object = True
        elif name in _RECORD_VALUES and (eq or rest):
            value_of = value if eq else rest.pop(0)
            if str(value_of).startswith("-"):
                return None
        else:
            return None
        if name in given:
            return None
        given[name] = value_of
    if "--out" not in given or given.get("--cpu-features", "auto") not in CPU_FEATURES:
        return None
    values = {**_RECORD_VALUES, **{f: False for f in _RECORD_FLAGS}, **given}
    ns = SimpleNamespace(command="record", cmd=list(argv[end:]),
                         **{k.lstrip("-").replace("-", "_"): v for k, v in values.items()})
    return ns  # type: ignore[return-value]  # the attributes argparse's Namespace has


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
    from counterd.commands.probe import probe, render_text

    result = probe()
    import json

    print(json.dumps(result.to_json(), indent=2) if args.json else render_text(result))
    return 0


def _record(args: argparse.Namespace) -> int:
    from counterd.commands.recording import record

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    events = [e.strip() for e in args.events.split(",") if e.strip()]
    from counterd.launch import Stopped

    try:
        result = record(cmd, out=args.out, backend=args.backend, events=events,
                        cpu_features=args.cpu_features, sample=args.sample,
                        prefetch=args.prefetch, count_from_start=args.count_from_start,
                        progress=lambda m: print(f"counterd record: {m}", file=sys.stderr,
                                                 flush=True))
    except Stopped as stop:  # after the command, before its records were written
        print(f"counterd record: stopped by {_signal_name(stop.sig)} before writing the "
              f"records; its spool removed, {args.out} not written", file=sys.stderr)
        return 128 + stop.sig
    from counterd.data.records import INFO_FLAGS, Superstep

    flagged = sum(1 for r in result.records if r.flags - INFO_FLAGS)
    shared = sum(1 for s in Superstep.group(result.records) if s.shared_cpus)
    # A command killed by signal N (exit_code -N) ends the recorder as a shell reports it, and
    # so does a recording stopped by one while the command ran a second time (callgrind).
    code = 128 - result.exit_code if result.exit_code < 0 else result.exit_code
    if result.stopped_by is not None and result.exit_code >= 0:
        code = 128 + result.stopped_by
    summary = {"out": str(result.out), "records": len(result.records), "backend": result.backend,
               "flagged": flagged, "shared_cpu": shared, "exit_code": result.exit_code,
               "status": code,
               "stopped_by": None if result.stopped_by is None else _signal_name(result.stopped_by),
               "skipped": list(result.skipped)}
    # On stderr, as perf stat does: stdout is the recorded command's own.
    if args.json:
        import json

        print(json.dumps(summary), file=sys.stderr)
    else:
        if result.exit_code < 0:
            ended = f"command killed by {_signal_name(-result.exit_code)} (exit {code})"
        else:
            ended = f"command exited {result.exit_code}"
            if result.stopped_by is not None:
                ended += (f"; its count under callgrind stopped by "
                          f"{_signal_name(result.stopped_by)} (exit {code}): supersteps it did "
                          "not reach are flagged counters_missing")
        print(f"counterd: {summary['records']} records ({flagged} flagged) from backend "
              f"{result.backend} -> {result.out}; {ended}", file=sys.stderr)
        if shared:
            print(f"counterd: {shared} superstep{'s' if shared > 1 else ''} had processes "
                  "taking turns on one CPU (shared_cpu; `counterd report` says which): pin each "
                  "process to its own CPU (os.sched_setaffinity) for times of the work alone",
                  file=sys.stderr)
    return code


def _signal_name(sig: int) -> str:
    import signal

    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _run(args: argparse.Namespace) -> int:
    from counterd.daemon import run

    return run(args.config)


class NoDaemon(CounterdError):
    """Neither a daemon nor a store to read: nothing was recorded through a daemon here, or
    not by this user. Exit status 1 (the query failed, its arguments were fine), as
    ``docker ps`` without a daemon; an empty store is an answer, exit 0."""

    exit_code = 1


def _from_daemon_or_store(args: argparse.Namespace, from_daemon: Callable[[Path], _T],
                          from_store: Callable[[Path], _T]) -> tuple[_T, str]:
    """``--store PATH``: read that file (who may: root, the daemon's user). Otherwise ask the
    daemon, which shows users their own runs (the store file is private); with no daemon
    running, read the configured store if this user can, saying so on stderr, else NoDaemon.
    Returns the answer and what gave it ("the store PATH", "the store of the daemon at
    SOCKET")."""
    if args.store is not None:
        return from_store(args.store), f"the store {args.store}"
    from counterd.daemon.config import load
    from counterd.daemon.query import DaemonUnreachable

    cfg = load(args.config)
    try:
        return from_daemon(cfg.socket_path), f"the store of the daemon at {cfg.socket_path}"
    except DaemonUnreachable as exc:
        unreachable = exc.what.removeprefix("cannot reach counterd at ")
        if os.access(cfg.store_path, os.R_OK):
            print(f"counterd {args.command}: no daemon answers at {unreachable}: read its store "
                  f"{cfg.store_path} directly", file=sys.stderr)
            return from_store(cfg.store_path), f"the store {cfg.store_path}"
        there = ("there is no store at" if not os.path.exists(cfg.store_path)
                 else "this user may not read the store")
        raise NoDaemon(f"no daemon answers at {unreachable} and {there} {cfg.store_path}",
                       "start the daemon (counterd run, or its systemd unit) and record through "
                       "it, or give --store PATH (--config FILE names a daemon's socket and "
                       "store); counterd report --records FILE reads a recording") from None


def _runs(args: argparse.Namespace) -> int:
    from counterd.daemon import query
    from counterd.report import render_runs

    if args.central is not None:
        if args.records is not None or args.store is not None:
            raise BadInput("--central reads the central store; --records files, --store a "
                           "local store", "give one of them")
        from counterd.central import reader

        central = [r for r in reader.runs(args.central) if args.uid is None or r.uid == args.uid]
        sys.stdout.write(reader.render_runs(central, args.json))
        return 0
    if args.records is not None:
        if args.store is not None or args.uid is not None:
            raise BadInput("--records reads files; --store or --uid reads the store",
                           "give one or the other")
        from counterd.report import nodes

        sys.stdout.write(nodes.render_runs(nodes.build(args.records), args.json))
        return 0

    rows, source = _from_daemon_or_store(
        args, lambda sock: query.runs_via_daemon(sock, args.uid),
        lambda path: query.runs_from_store(path, args.uid))
    if args.json:
        import json

        print(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        print(render_runs(rows, source))
    return 0


def _export(args: argparse.Namespace) -> int:
    """``counterd export``: a daemon run as the file convention's records file."""
    from counterd.daemon import query
    from counterd.data.records import write_jsonl

    (records, domains, why), source = _from_daemon_or_store(
        args, lambda sock: query.export_run(None, sock, args.run, args.uid),
        lambda path: query.export_run(path, None, args.run, args.uid))
    write_jsonl(records, args.out, header=[d.to_json() for d in domains])
    for line in why:
        print(f"counterd export: no clock domain for {line}: spans across nodes will be "
              "unknown for it", file=sys.stderr)
    print(f"counterd export: wrote {args.out} ({len(records)} records of run "
          f"{records[0].run_id} from {source}, {len(domains)} clock domain(s))", file=sys.stderr)
    return 0


def _import(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from counterd.commands.importing import import_files
    from counterd.data.env import ENV_SOCKET

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
    fmt = _report_format(args.out, "json" if args.json else args.format)
    if args.run_option is not None:
        if args.run is not None and args.run != args.run_option:
            raise BadInput(f"two run ids: {args.run!r:.80} and --run {args.run_option!r:.80}",
                           "give one")
        args.run = args.run_option
    if args.central is not None:
        return _report_central(args, fmt)
    if args.records is not None and (args.run or args.store or args.uid is not None):
        raise BadInput("--records reads a file; a RUN, --uid or --store reads the store",
                       "give one or the other")
    if args.across_nodes and args.records is None:
        raise BadInput("--across-nodes reads records files", "give --records FILE...")
    from counterd import prediction, report  # not before: the central report needs neither

    profile = args.profile
    if profile is None and (args.config is not None or args.records is None):
        from counterd.daemon.config import load

        profile = load(args.config).profile
    predict, why = prediction.load(
        profile, warn=lambda m: print(f"counterd report: warning: {m}", file=sys.stderr))
    if args.profile is not None and predict is None:
        raise BadInput(why, "give a profile file (predict calibrate --out) or a built-in name")
    if args.records is not None and (len(args.records) > 1 or args.across_nodes):
        from counterd.data.units import duration_ns
        from counterd.report import nodes

        try:
            bound = None if args.clock_bound is None else duration_ns(args.clock_bound)
        except ValueError as exc:
            raise BadInput(f"--clock-bound {args.clock_bound!r}: {exc}",
                           "give a duration such as 1ms or 50us") from None
        if predict is not None:
            print("counterd report: predictions are not part of the report across nodes "
                  "(report each node's file alone for them)", file=sys.stderr)
        text = nodes.render(nodes.build(args.records, clock_bound_ns=bound), fmt)
        return _write_report(text, args.out, fmt)
    if args.clock_bound is not None:
        raise BadInput("--clock-bound is for reports across nodes",
                       "give several --records files, or --across-nodes")
    if args.records is not None:
        from counterd.data.records import SuperstepRecord, read_jsonl

        records: Iterable[SuperstepRecord] = read_jsonl(args.records[0])  # streamed into build
        source = str(args.records[0])
    else:
        from counterd.daemon import query

        (records, source), _ = _from_daemon_or_store(
            args, lambda sock: query.records_via_daemon(sock, args.run, args.uid),
            lambda path: query.records_from_store(path, args.run, args.uid))
    rep = report.build(records, predict=predict, prediction_note=why, source=source)
    return _write_report(report.render(rep, fmt, verbose=args.verbose), args.out, fmt)


def _report_central(args: argparse.Namespace, fmt: str) -> int:
    """``counterd report --central DSN --run RUN``: the run across nodes, as the reader's
    role may see it (row-level security)."""
    from counterd.central import reader
    from counterd.data.units import duration_ns

    if args.records is not None or args.store is not None or args.across_nodes:
        raise BadInput("--central reads the central store; --records files, --store a local "
                       "store", "give one of them")
    if not args.run:
        raise BadInput("--central needs the run", "give --run RUN (counterd runs --central DSN "
                       "lists them)")
    try:
        bound = None if args.clock_bound is None else duration_ns(args.clock_bound)
    except ValueError as exc:
        raise BadInput(f"--clock-bound {args.clock_bound!r}: {exc}",
                       "give a duration such as 1ms or 50us") from None
    return _write_report(reader.report(args.central, args.run, args.uid, fmt, bound),
                         args.out, fmt)


def _central(args: argparse.Namespace) -> int:
    """``counterd central migrate|node|reader``: the administrator's side of the central
    store (docs/cluster.md)."""
    from counterd.central import psycopg_module, schema

    psycopg = psycopg_module()
    try:
        with psycopg.connect(args.dsn, connect_timeout=10) as conn:
            if args.action == "migrate":
                before = schema.schema_version(conn)
                conn.commit()
                after = schema.migrate(conn)
                print(f"counterd central: schema version {before} -> {after}", file=sys.stderr)
            elif args.action == "node":
                schema.add_node(conn, args.role)
                print(f"counterd central: {args.role} may ship records", file=sys.stderr)
            else:
                schema.add_reader(conn, args.role, args.uid)
                print(f"counterd central: {args.role} reads uid {args.uid}'s runs",
                      file=sys.stderr)
    except psycopg.Error as exc:
        raise BadInput(f"central {args.action}: {' '.join(str(exc).split())}",
                       "connect as the database's owner or an administrator; roles named "
                       "must exist (CREATE ROLE name LOGIN)") from None
    return 0


def _write_report(text: str, out: Path | None, fmt: str) -> int:
    from counterd.util.fsutil import atomic_write_text

    if out is not None:
        atomic_write_text(out, text)
        print(f"counterd report: wrote {out} ({fmt})", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _cluster(args: argparse.Namespace) -> int:
    """``counterd cluster targets``: thin; counterd.commands.cluster does the work."""
    from counterd.commands import cluster
    from counterd.util.fsutil import atomic_write_text

    hosts = cluster.expand_hostlist(",".join(args.hostlist))
    if args.file is not None:
        try:
            text = args.file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read {args.file}: {exc}", "give a readable host file"
                           ) from None
        hosts = list(dict.fromkeys(hosts + cluster.hosts_from_lines(text.splitlines())))
    text = cluster.file_sd(hosts, args.port, cluster.parse_labels(args.label))
    if args.out is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(args.out, text)
        print(f"counterd cluster targets: wrote {args.out} ({len(hosts)} targets)",
              file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _plain_record(argv)
    if args is None:
        from counterd.commands.cli_options import parser

        args = parser(argv[0] if argv else None).parse_args(argv)
    try:
        command = {"probe": _probe, "record": _record, "run": _run, "runs": _runs,
                   "report": _report, "import": _import, "cluster": _cluster,
                   "export": _export, "central": _central}[args.command]
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
        from counterd.util.cliutil import closed_pipe

        return closed_pipe()


def console() -> NoReturn:
    """The ``counterd`` console script: :func:`main`; after ``record``, the process ends
    without the interpreter's teardown (freeing every module it loaded: 10-12 ms on this kind
    of host, added to the recorded command's wall time). Nothing is left for the teardown to
    do there: the records file is written and closed, the streams are flushed here."""
    code = main()
    if sys.argv[1:2] == ["record"]:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a reader gone: as the teardown would, say nothing more
                pass
        os._exit(code & 0xFF)
    sys.exit(code)


if __name__ == "__main__":
    console()
