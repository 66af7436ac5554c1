"""The Prometheus side of a cluster: scrape targets for every node's counterd.

``counterd cluster targets`` writes Prometheus's ``file_sd`` JSON from a host list in
Slurm's hostlist syntax (``scontrol show hostnames`` reads the same) or a file of them; the
scrape configuration in ``contrib/prometheus/prometheus.yml`` reads that file and re-reads it
when it changes (the file is replaced atomically, so a scrape never sees half of it).

Hostlist syntax: comma-separated items; an item is text with any number of bracket groups,
each a comma-separated list of numbers and ranges ``lo-hi``, zero-padded to the width of
``lo`` as Slurm does (``node[001-128]``, ``n[1-3,7]``, ``rack[1-2]-n[01-04]``: every
combination, the first bracket slowest). Pure functions; BadInput for anything else.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence

from counterd.data.errors import BadInput

MAX_HOSTS = 100_000  # a hostlist that expands beyond this is a mistake
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_HOST = re.compile(r"^[A-Za-z0-9_.:%-]+$")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets; BadInput for unbalanced brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise BadInput(f"hostlist {text!r}: nested brackets", "write node[01-04]")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise BadInput(f"hostlist {text!r}: ']' without '['", "write node[01-04]")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise BadInput(f"hostlist {text!r}: '[' without ']'", "write node[01-04]")
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _bracket(body: str, where: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise BadInput(f"hostlist {where!r}: [{body}] holds {part!r}",
                           "use numbers and ranges: [001-128] or [1-3,7]")
        if not dash:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise BadInput(f"hostlist {where!r}: range {part} runs backwards",
                           "write the lower bound first")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise BadInput(f"hostlist {where!r}: range {part} is too long",
                           f"at most {MAX_HOSTS} hosts")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm hostlist expression, in order, duplicates dropped."""
    hosts: list[str] = []
    for item in _split_top(text):
        names = [""]
        for literal, bracket in re.findall(r"([^\[\]]*)(\[[^\]]*\])?", item):
            if not literal and not bracket:
                continue
            choices = _bracket(bracket[1:-1], item) if bracket else [""]
            names = [n + literal + c for n in names for c in choices]
            if len(names) > MAX_HOSTS:
                raise BadInput(f"hostlist {item!r} expands to more than {MAX_HOSTS} hosts",
                               "split it or check the ranges")
        hosts.extend(names)
        if len(hosts) > MAX_HOSTS:
            raise BadInput(f"hostlist expands to more than {MAX_HOSTS} hosts",
                           "split it or check the ranges")
    for h in hosts:
        if not _HOST.match(h):
            raise BadInput(f"host {h!r} is not a host name or address",
                           "use names like node001 or addresses")
    return list(dict.fromkeys(hosts))


def hosts_from_lines(lines: Iterable[str]) -> list[str]:
    """Hosts of a file: a hostlist expression per line (one host is one), ``#`` comments."""
    hosts: list[str] = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            hosts.extend(expand_hostlist(line))
    return list(dict.fromkeys(hosts))


def target(host: str, port: int) -> str:
    """``host:port`` (an IPv6 address in brackets)."""
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` items as target labels (Prometheus label names)."""
    labels: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not _LABEL.match(name) or name.startswith("__"):
            raise BadInput(f"label {item!r} is not NAME=VALUE with a Prometheus label name",
                           "e.g. --label cluster=hpc1")
        labels[name] = value
    return labels


def file_sd(hosts: Sequence[str], port: int, labels: Mapping[str, str]) -> str:
    """Prometheus ``file_sd`` JSON: one target group of every host's ``host:port``."""
    if not hosts:
        raise BadInput("no hosts given", "give a hostlist (node[001-128]) or --file")
    if not 1 <= port <= 65535:
        raise BadInput(f"port {port} is not a TCP port", "use e.g. 9464")
    group = {"targets": [target(h, port) for h in hosts], "labels": dict(labels)}
    return json.dumps([group], indent=2) + "\n"
