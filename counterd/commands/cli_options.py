"""The ``counterd`` command line's options for argparse: one builder per command and
:func:`parser`, which builds only the named command's (:mod:`counterd.commands.cli` reads ``counterd
record``'s plain form without it, and runs the commands).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable


def _probe_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--machine", metavar="FILE", type=Path, default=None,
                   help="machine description (TOML, see counterd/machine/files.py) instead of "
                   "sysfs (default: $COUNTERD_MACHINE)")


def _record_options(p: argparse.ArgumentParser) -> None:
    import argparse
    from pathlib import Path

    from counterd.commands.recording import CPU_FEATURES

    p.add_argument("--backend", default="auto",
                   help="auto, perf, papi, sim, callgrind or none (default: auto)")
    p.add_argument("--events", default="",
                   help="comma-separated canonical counters: only these are recorded; one "
                   "the backend cannot give here is an error (default: all it supports)")
    p.add_argument("--out", required=True, type=Path, help="records as JSON lines")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--machine", metavar="FILE", type=Path, default=None,
                   help="machine description for the simulating backends (TOML, see "
                   "counterd/machine/files.py) instead of sysfs (default: $COUNTERD_MACHINE)")
    p.add_argument("--cpu-features", default="auto", choices=CPU_FEATURES,
                   help="as-counted: hide from the command's run-time code dispatch (numpy, "
                   "OpenBLAS, glibc) the CPU features valgrind lacks (AVX-512), so that it "
                   "runs the code Callgrind counts; native (and the default, auto): hide "
                   "nothing, time the program as it runs without counterd")
    p.add_argument("--prefetch", action="store_true",
                   help="with --backend callgrind: simulate valgrind's hardware prefetcher on "
                   "the last level, so that its misses are those a stream prefetcher does "
                   "not cover (write-backs are then not counted: valgrind simulates one or "
                   "the other)")
    p.add_argument("--count-from-start", action="store_true",
                   help="with --backend callgrind: count each process from its start, so that "
                   "the simulated last level holds the start-up's lines at the first "
                   "superstep (default, where the command marks supersteps: from each "
                   "process's first superstep, 3-5x faster for a Python program)")
    p.add_argument("--sample", metavar="DURATION:K", default=None,
                   help="read the counters of only 1 in K supersteps shorter than DURATION "
                   "(e.g. 50us:10), per superstep name and processor; the others' counters "
                   "are the last measured one's scaled by time, flagged 'sampled' (default: "
                   "$COUNTERD_SAMPLE, else every superstep is read)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def _run_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("--config", type=Path, default=None,
                   help="TOML config (default: built-in defaults + COUNTERD_* variables)")
    p.add_argument("--json", action="store_true", help="(accepted for symmetry; logs only)")


def _runs_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("--store", type=Path, default=None,
                   help="read this store file directly (who may read it: root, the "
                   "daemon's user); default: ask the daemon")
    p.add_argument("--config", type=Path, default=None,
                   help="TOML config (socket.path, store.path)")
    p.add_argument("--uid", type=int, default=None,
                   help="only this user's runs (another's: root and socket.allowed_group)")
    p.add_argument("--records", type=Path, nargs="+", default=None, metavar="FILE",
                   help="the runs of records files (counterd record --out; one per node), "
                   "across nodes, instead of the store")
    p.add_argument("--central", default=None, metavar="DSN",
                   help="the runs of the central PostgreSQL store that your role may read "
                   "(a libpq connection string: host=... dbname=... user=YOUR_ROLE)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _import_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("paths", nargs="*", type=Path, metavar="FILE|DIR",
                   help="spill files or directories (default: $COUNTERD_SPILL, else the "
                   "default spill directory)")
    p.add_argument("--socket", type=Path, default=None,
                   help="the daemon's socket (default: $COUNTERD_SOCKET, else the default "
                   "socket)")
    p.add_argument("--store", type=Path, default=None,
                   help="write into this store instead of sending to the daemon")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for the daemon's acknowledgements (default: 30)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _report_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("run", nargs="?", default=None, help="run id (default: the latest run)")
    p.add_argument("--records", type=Path, nargs="+", default=None, metavar="FILE",
                   help="records JSONL files (counterd record --out) instead of the store; "
                   "several (one per node): the run across nodes")
    p.add_argument("--central", default=None, metavar="DSN",
                   help="read the run across nodes from the central PostgreSQL store, "
                   "through your own role (host=... dbname=... user=YOUR_ROLE)")
    p.add_argument("--run", dest="run_option", default=None, metavar="RUN",
                   help="the run id (the same as the positional RUN)")
    p.add_argument("--across-nodes", action="store_true",
                   help="with one --records file: report it across nodes (its records of "
                   "several hosts, gathered from a shared spool)")
    p.add_argument("--clock-bound", default=None, metavar="DURATION",
                   help="across nodes: the site's bound on two nodes' realtime clocks' "
                   "disagreement (NTP/PTP, e.g. 1ms), for nodes whose kernel stated none")
    p.add_argument("--store", type=Path, default=None,
                   help="read this store file directly (who may read it: root, the daemon's "
                   "user); default: ask the daemon, which gives you your own runs")
    p.add_argument("--uid", type=int, default=None,
                   help="the run of this user (another's: root and socket.allowed_group)")
    p.add_argument("--config", type=Path, default=None,
                   help="TOML config (socket, store, profile)")
    p.add_argument("--profile", default=None,
                   help="machine profile for predictions (default: config predictor.profile)")
    p.add_argument("--format", choices=("text", "json", "csv", "html"), default=None,
                   help="output format (default: text, or from the --out suffix)")
    p.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="text and HTML: show every flag of a row, also those that only say "
                   "where its numbers come from (the JSON and CSV always have them)")


def _export_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    p.add_argument("run", nargs="?", default=None, help="run id (default: the latest run)")
    p.add_argument("--out", type=Path, required=True,
                   help="the records file (JSON lines, with this node's clock domain)")
    p.add_argument("--store", type=Path, default=None,
                   help="read this store file directly (root, the daemon's user); default: "
                   "ask the daemon")
    p.add_argument("--uid", type=int, default=None,
                   help="the run of this user (another's: root and socket.allowed_group)")
    p.add_argument("--config", type=Path, default=None,
                   help="TOML config (socket.path, store.path)")


def _cluster_options(p: argparse.ArgumentParser) -> None:
    from pathlib import Path

    from counterd.util.cliutil import Parser

    sub = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    t = sub.add_parser("targets", help="write Prometheus file_sd JSON of every node's counterd")
    t.add_argument("hostlist", nargs="*",
                   help="hosts in Slurm's hostlist syntax, e.g. node[001-128],login1")
    t.add_argument("--file", type=Path, default=None,
                   help="read hosts from this file (a hostlist per line, # comments)")
    t.add_argument("--port", type=int, default=9464, help="metrics.listen's port (9464)")
    t.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                   help="a label on every target, e.g. cluster=hpc1 (repeatable)")
    t.add_argument("--out", type=Path, default=None,
                   help="write here (atomically: Prometheus re-reads it) instead of stdout")


def _central_options(p: argparse.ArgumentParser) -> None:
    c = p.add_subparsers(dest="action", required=True)
    m = c.add_parser("migrate", help="create or upgrade the central schema, its roles and "
                     "policies (as the database's owner)")
    m.add_argument("dsn", help="libpq connection string (host=... dbname=... user=OWNER)")
    n = c.add_parser("node", help="let a login role ship records (a node's daemon)")
    n.add_argument("dsn")
    n.add_argument("role", help="the node's existing login role (central.role)")
    r = c.add_parser("reader", help="let a database role read one uid's runs")
    r.add_argument("dsn")
    r.add_argument("role", help="the user's existing database role")
    r.add_argument("uid", type=int, help="the uid whose runs the role reads")


_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "probe": ("which counters and backends work on this host, and why not", _probe_options),
    "record": ("run a command with superstep markers active", _record_options),
    "run": ("the daemon, in the foreground (systemd runs it)", _run_options),
    "runs": ("your runs in the daemon's store (everyone's: root and socket.allowed_group)",
             _runs_options),
    "import": ("send records a program spilled (daemon down or slow) to the daemon, then "
               "remove the files", _import_options),
    "report": ("per-superstep report of a run (store or records file)", _report_options),
    "export": ("a run of this node's daemon as a records file with its clock domain (for "
               "counterd report --records a b ... across nodes)", _export_options),
    "cluster": ("the Prometheus side of a cluster: cluster targets writes file_sd JSON",
                _cluster_options),
    "central": ("administer the central PostgreSQL store: migrate, node ROLE, reader ROLE UID",
                _central_options),
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. When ``command`` names one of the commands only its options are
    built (argparse sets up a formatter for every option it adds: 4-6 ms for all of them);
    otherwise (None, a typo, ``--help``) all are."""
    from counterd.util.cliutil import Parser, VersionAction

    p = Parser(prog="counterd", description="per-superstep memory-hierarchy counters")
    p.add_argument("--version", action=VersionAction)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (summary, options) in _COMMANDS.items():
        sp = sub.add_parser(name, help=summary)
        if command == name or command not in _COMMANDS:
            options(sp)
    return p
