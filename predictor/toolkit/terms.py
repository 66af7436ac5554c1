"""Terms: the basis functions every model of the project is a linear combination of.

A term knows the inputs it needs and evaluates itself, element-wise, on a table of inputs (a
mapping from input name to an array; all arrays broadcast together). The same terms serve the
cost functions (F1 on a superstep's per-processor counters, F2 on their sums, F3 on per-bank
counts), the growth models of pilot runs (``n``, ``n*log(n)``, ``n^2`` in a parameter n) and the
models of seed 003 (Brewer, "High-level optimization via automated statistical modeling"),
whose terms are products of parameters (``i*w*h``) and derived quantities (``2^bpd``,
``ceil(width/bpd)*keys``).

Every term has one canonical text form, ``str(term)``, which profiles, model files and the
command line use; :func:`parse` reads it back (``parse(str(t)) == t``).

Grammar (a term is a product of factors joined by ``*``):

    1 | const                 the constant
    x | x^a                   an input (a counter, a parameter, a pattern quantity) to a power
    log(x) | log(x)^b         log2 of an input, to a power
    2^x                       two to the power of an input (003: bins = 2^bpd)
    ceil(x/y)                 ceil of a ratio of an input and an input or a number (003:
                              iterations = ceil(width/bpd); bytes per digit = ceil(bpd/8))
    max(x-c,0)                a hinge at c: 0 below, x - c above (a cost per item that
                              changes where the data leave a cache)
    acc                       loads + stores (seed 004's C0E2 + C0E3)
    stream:x                  x^2 / acc, a counter-only proxy for streamed misses (a miss per
                              line of a stride-1 stream has x/acc = word/line, a miss per
                              access 1, so a*x + b*x^2/acc charges prefetched streams less)
    max(x,y)                  the larger of two inputs (``max(loads,stores)``: the accesses a
                              processor issues when a load and a store go out together, as in
                              a read-modify-write; predictor/NOTES.md)
    rfo:x                     max(x - loads, 0): misses no load can have caused, a lower bound
                              on the store misses (reads for ownership) of a level whose miss
                              counter is x (predictor/NOTES.md)

Powers of the same input merge: ``n*log(n)`` is one factor x^1 log2(x)^1.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from predictor.errors import BadInput

Array = NDArray[np.float64]
Table = Mapping[str, ArrayLike]

_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_NUMBER = r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[-+]?[0-9]+)?"


def _column(table: Table, name: str) -> Array:
    try:
        return np.asarray(table[name], dtype=np.float64)
    except KeyError:
        raise BadInput(f"no input named {name!r} (have: {', '.join(sorted(table)) or 'none'})",
                       "give every input a term needs, or drop the term") from None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class Term(ABC):
    """One basis function. Subclasses are frozen dataclasses: hashable, comparable, picklable."""

    @property
    @abstractmethod
    def needs(self) -> tuple[str, ...]:
        """Input names this term reads."""

    @abstractmethod
    def evaluate(self, table: Table) -> Array:
        """The term's value for every entry of the table's (broadcast) arrays."""

    def __repr__(self) -> str:
        return f"term({str(self)!r})"


@dataclass(frozen=True, repr=False)
class Const(Term):
    @property
    def needs(self) -> tuple[str, ...]:
        return ()

    def evaluate(self, table: Table) -> Array:
        shape = np.broadcast_shapes(*(np.shape(v) for v in table.values())) if table else ()
        return np.ones(shape)

    def __str__(self) -> str:
        return "1"


@dataclass(frozen=True, repr=False)
class Power(Term):
    """x^a * log2(x)^b: an input (a=1, b=0), a growth term (n log n: a=1, b=1)."""

    input: str
    exponent: float = 1.0
    log_exponent: float = 0.0

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.input,)

    def evaluate(self, table: Table) -> Array:
        x = _column(table, self.input)
        out = np.ones_like(x)
        if self.exponent:
            out = out * (x if self.exponent == 1 else np.power(x, self.exponent))
        if self.log_exponent:
            if np.any(x <= 0):
                raise BadInput(f"log({self.input}) needs {self.input} > 0 (found "
                               f"{float(np.min(x)):g})", "drop the log term or the samples")
            out = out * np.power(np.log2(x), self.log_exponent)
        return out

    def __str__(self) -> str:
        parts = []
        if self.exponent:
            parts.append(self.input if self.exponent == 1
                         else f"{self.input}^{_num(self.exponent)}")
        if self.log_exponent:
            parts.append(f"log({self.input})" if self.log_exponent == 1
                         else f"log({self.input})^{_num(self.log_exponent)}")
        return "*".join(parts) or "1"


@dataclass(frozen=True, repr=False)
class Exp2(Term):
    input: str

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.input,)

    def evaluate(self, table: Table) -> Array:
        return np.exp2(_column(table, self.input))

    def __str__(self) -> str:
        return f"2^{self.input}"


@dataclass(frozen=True, repr=False)
class CeilDiv(Term):
    numerator: str
    denominator: str | float  # an input, or a number > 0

    @property
    def needs(self) -> tuple[str, ...]:
        if isinstance(self.denominator, str):
            return (self.numerator, self.denominator)
        return (self.numerator,)

    def evaluate(self, table: Table) -> Array:
        d = (_column(table, self.denominator) if isinstance(self.denominator, str)
             else np.float64(self.denominator))
        if np.any(d <= 0):
            den = self.denominator
            raise BadInput(f"{self} needs {den if isinstance(den, str) else _num(den)} > 0",
                           "drop the samples where it is not")
        return np.ceil(_column(table, self.numerator) / d)

    def __str__(self) -> str:
        d = self.denominator
        return f"ceil({self.numerator}/{d if isinstance(d, str) else _num(d)})"


@dataclass(frozen=True, repr=False)
class Hinge(Term):
    """max(x - knot, 0): with x itself, a piecewise-linear cost with a break at the knot."""

    input: str
    knot: float

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.input,)

    def evaluate(self, table: Table) -> Array:
        return np.maximum(_column(table, self.input) - self.knot, 0.0)

    def __str__(self) -> str:
        return f"max({self.input}-{_num(self.knot)},0)"


@dataclass(frozen=True, repr=False)
class Accesses(Term):
    @property
    def needs(self) -> tuple[str, ...]:
        return ("loads", "stores")

    def evaluate(self, table: Table) -> Array:
        return _column(table, "loads") + _column(table, "stores")

    def __str__(self) -> str:
        return "acc"


@dataclass(frozen=True, repr=False)
class Streaming(Term):
    counter: str

    @property
    def needs(self) -> tuple[str, ...]:
        return ("loads", "stores", self.counter)

    def evaluate(self, table: Table) -> Array:
        c = _column(table, self.counter)
        acc = Accesses().evaluate(table)
        c, acc = np.broadcast_arrays(c, acc)
        return np.divide(c * c, acc, out=np.zeros(c.shape), where=acc > 0)

    def __str__(self) -> str:
        return f"stream:{self.counter}"


@dataclass(frozen=True, repr=False)
class Larger(Term):
    """max(x, y) of two inputs, element-wise."""

    first: str
    second: str

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.first, self.second)

    def evaluate(self, table: Table) -> Array:
        return np.maximum(_column(table, self.first), _column(table, self.second))

    def __str__(self) -> str:
        return f"max({self.first},{self.second})"


@dataclass(frozen=True, repr=False)
class StoreMisses(Term):
    """max(x - loads, 0): the misses of a level (counter x) that loads cannot account for.
    Every load misses at most once, so this is a lower bound on the misses stores caused
    (reads for ownership); exact when every load misses or none of the stores hit."""

    counter: str

    @property
    def needs(self) -> tuple[str, ...]:
        return ("loads", self.counter)

    def evaluate(self, table: Table) -> Array:
        return np.maximum(_column(table, self.counter) - _column(table, "loads"), 0.0)

    def __str__(self) -> str:
        return f"rfo:{self.counter}"


@dataclass(frozen=True, repr=False)
class Product(Term):
    """A product of two or more factors (never nested, never holding Const)."""

    factors: tuple[Term, ...]

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for f in self.factors for n in f.needs))

    def evaluate(self, table: Table) -> Array:
        out = self.factors[0].evaluate(table)
        for f in self.factors[1:]:
            out = out * f.evaluate(table)
        return out

    def __str__(self) -> str:
        return "*".join(str(f) for f in self.factors)


def product(factors: Iterable[Term]) -> Term:
    """The canonical product: constants dropped, powers of one input merged, one factor is
    itself. ``product([Power("n"), Power("n", 0, 1)]) == Power("n", 1, 1)``."""
    out: list[Term] = []
    powers: dict[str, int] = {}
    for f in factors:
        for g in f.factors if isinstance(f, Product) else (f,):
            if isinstance(g, Const):
                continue
            if isinstance(g, Power):
                if g.input in powers:
                    i = powers[g.input]
                    p = out[i]
                    assert isinstance(p, Power)
                    out[i] = Power(g.input, p.exponent + g.exponent,
                                   p.log_exponent + g.log_exponent)
                    continue
                powers[g.input] = len(out)
            out.append(g)
    # Sorted by text: a product has one canonical form whatever order it was written in.
    out = sorted((f for f in out if str(f) != "1"), key=str)
    if not out:
        return Const()
    return out[0] if len(out) == 1 else Product(tuple(out))


_FACTORS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"(?:1|const)"), lambda m: Const()),
    (re.compile(r"acc"), lambda m: Accesses()),
    (re.compile(rf"stream:({_NAME})"), lambda m: Streaming(m[1])),
    (re.compile(rf"rfo:({_NAME})"), lambda m: StoreMisses(m[1])),
    (re.compile(rf"max\(({_NAME}),({_NAME})\)"), lambda m: Larger(m[1], m[2])),
    (re.compile(rf"log\(({_NAME})\)(?:\^({_NUMBER}))?"),
     lambda m: Power(m[1], 0.0, float(m[2] or 1))),
    (re.compile(rf"2\^({_NAME})"), lambda m: Exp2(m[1])),
    (re.compile(rf"ceil\(({_NAME})/({_NAME})\)"), lambda m: CeilDiv(m[1], m[2])),
    (re.compile(rf"ceil\(({_NAME})/({_NUMBER})\)"), lambda m: CeilDiv(m[1], float(m[2]))),
    (re.compile(rf"max\(({_NAME})-({_NUMBER}),0\)"), lambda m: Hinge(m[1], float(m[2]))),
    (re.compile(rf"({_NAME})(?:\^({_NUMBER}))?"), lambda m: Power(m[1], float(m[2] or 1))),
)


def parse(text: str | Term) -> Term:
    """A term from its text form (see the module docstring); a Term is returned as is."""
    if isinstance(text, Term):
        return text
    factors = []
    for part in str(text).replace(" ", "").split("*"):
        for pattern, make in _FACTORS:
            m = pattern.fullmatch(part)
            if m:
                factors.append(make(m))
                break
        else:
            raise BadInput(f"cannot read the term {text!r} (at {part!r})",
                           "write a product of factors such as n, n^2, log(n), 2^bpd, "
                           "ceil(width/bpd), acc, stream:l1d_misses, rfo:l2_misses or "
                           "max(loads,stores), joined by '*'")
    return product(factors)


def parse_all(texts: Iterable[str | Term]) -> tuple[Term, ...]:
    """Terms from text, duplicates (after canonicalisation) refused."""
    terms = tuple(parse(t) for t in texts)
    seen: set[Term] = set()
    for t in terms:
        if t in seen:
            raise BadInput(f"the term {t} is listed twice", "list every term once")
        seen.add(t)
    return terms


def needs(terms: Iterable[Term]) -> tuple[str, ...]:
    """Every input the terms read, in first-use order."""
    return tuple(dict.fromkeys(n for t in terms for n in t.needs))


def growth_terms(param: str, exponents: Sequence[float] = (0.5, 1, 1.5, 2, 3),
                 log_exponents: Sequence[float] = (0, 1, 2), *,
                 const: bool = True) -> tuple[Term, ...]:
    """The growth terms x^a log2(x)^b over the given exponents (Extra-P's performance-model
    normal form for one parameter), with the constant first. The defaults hold n, log n,
    n log n, n^2, n^2 log n ... (a = 0, b = 0 is the constant)."""
    out: list[Term] = [Const()] if const else []
    for a in (0.0, *exponents):
        for b in log_exponents:
            if a == 0 and b == 0:
                continue
            out.append(Power(param, float(a), float(b)))
    return tuple(out)


def design(terms: Sequence[Term], table: Table) -> Array:
    """The ``(samples, terms)`` design matrix of 1-D inputs."""
    rows = _rows(table)
    cols = [np.broadcast_to(t.evaluate(table), rows) for t in terms]
    return np.column_stack(cols) if cols else np.zeros((rows[0], 0))


def _rows(table: Table) -> tuple[int]:
    lengths = {np.size(v) for v in table.values() if np.ndim(v) > 0}
    if len(lengths) > 1:
        raise BadInput(f"the inputs have different numbers of samples ({sorted(lengths)})",
                       "give every input one value per sample")
    return (lengths.pop() if lengths else 1,)


def check_design(terms: Sequence[Term], X: Array, *, where: str,
                 independent: bool = True) -> None:
    """Refuse what no least-squares fit can estimate: a term that is zero on every sample, a
    term that is constant beside the constant (a parameter with one value), and, with
    ``independent``, a term that is a linear combination of the terms before it (for searches
    that fit every term at once). The error names the term and the fix."""
    n = X.shape[0]
    has_const = any(isinstance(t, Const) for t in terms)
    for j, t in enumerate(terms):
        col = X[:, j]
        if not np.all(np.isfinite(col)):
            raise BadInput(f"{where}: the term {t} is not finite on every sample",
                           "check the inputs it reads: " + ", ".join(t.needs))
        if not np.any(col):
            raise BadInput(f"{where}: the term {t} is zero on every sample",
                           "drop it, or give samples where it is not zero")
        if has_const and not isinstance(t, Const) and np.ptp(col) == 0 and n > 1:
            raise BadInput(f"{where}: the term {t} takes one value on every sample "
                           f"({col[0]:g}), so it cannot be told apart from the constant",
                           "profile over more than one value of " + ", ".join(t.needs))
    # Exact dependence only (tolerance 1e-12 on unit-norm columns): growth-term lists
    # are near-collinear by nature, and the term search copes with that.
    if not independent:
        return
    rank = 0
    scaled = X / np.linalg.norm(X, axis=0)
    for j, t in enumerate(terms):
        r = np.linalg.matrix_rank(scaled[:, :j + 1], tol=1e-12)
        if r == rank:
            raise BadInput(f"{where}: the term {t} is a linear combination of the terms "
                           "before it on these samples",
                           "drop it, or profile over more distinct parameter values")
        rank = r

