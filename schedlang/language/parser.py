"""Text -> AST, with Lark (LALR, strict). Syntax errors become located `SyntaxProblem`s."""
from __future__ import annotations

import dataclasses
import functools

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from . import ast
from .errors import DataError, Loc, SyntaxProblem
from .paths import readable_file
from .resources import grammar_path


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    # cache=True keeps the LALR tables in a temp file keyed by the grammar's hash: startup
    # drops from ~0.5 s to a few ms after the first run.
    return Lark(grammar_path().read_text(), parser="lalr", strict=True,
                propagate_positions=True, maybe_placeholders=True, cache=True)


# Terminal names as a user would read them.
_PRETTY = {
    "NAME": "a name", "NUMBER": "a number", "QUANTITY": "a quantity with a unit", "STRING": "a string",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "MINUS": "'-'", "PLUS": "'+'", "STAR": "'*'",
    "SLASH": "'/'", "$END": "end of file",
}


def _pretty(term: str) -> str:
    if term in _PRETTY:
        return _PRETTY[term]
    pattern = _lark().get_terminal(term).pattern if term in {t.name for t in _lark().terminals} else None
    if pattern is not None and pattern.type == "str":
        return f"'{pattern.value}'"
    return term.lower()


def _unescape(text: str) -> str:
    body = text[1:-1]
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape") if "\\" in body else body


def _loc(path: str, meta_or_token) -> Loc:
    line = getattr(meta_or_token, "line", 0) or 0
    col = getattr(meta_or_token, "column", 0) or 0
    return Loc(path, line, col)


def _split_number(text: str) -> tuple[float, str]:
    i = len(text)
    while i and text[i - 1].isalpha():
        i -= 1
    return float(text[:i]), text[i:]


class _Builder(Transformer):
    """Lark tree -> schedlang.language.ast, one method per grammar rule."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def L(self, meta) -> Loc:  # noqa: N802 - short on purpose, used everywhere below
        return _loc(self.path, meta)

    def at(self, tok) -> _GName:
        """A token's text that remembers where it was written (for errors that point at it)."""
        return _GName(str(tok), Loc(self.path, tok.line, tok.column))

    # --- top level
    @v_args(meta=True)
    def start(self, meta, items):
        return ast.Module(Loc(self.path, 1, 1), self.path, list(items))

    @v_args(meta=True)
    def model_decl(self, meta, c):
        return ast.ModelDecl(self.L(meta), self.at(c[0]), _unescape(c[1]) if c[1] else "")

    @v_args(meta=True)
    def use_decl(self, meta, c):
        tok = c[0]
        if tok.type == "STRING":
            return ast.UseDecl(self.L(meta), _GName(_unescape(tok), self.at(tok).loc), True)
        return ast.UseDecl(self.L(meta), self.at(tok), False)

    @v_args(meta=True)
    def drop_decl(self, meta, c):
        return ast.DropDecl(self.L(meta), self.at(c[0]))

    @v_args(meta=True)
    def decode_decl(self, meta, c):
        roles, locs = {}, {}
        for arg in c[1:]:
            if arg is None:
                continue
            role, target, loc = arg
            roles[role] = target
            locs[role] = loc
        return ast.DecodeDecl(self.L(meta), self.at(c[0]), roles, locs)

    @v_args(meta=True)
    def decode_ext(self, meta, c):
        return dataclasses.replace(self.decode_decl(meta, c), extend=True)

    @v_args(meta=True)
    def decode_arg(self, meta, c):
        tok = c[1]
        if tok.type == "QUANTITY":
            value, unit = _split_number(str(tok))
            return (str(c[0]), ast.Num(self.L(meta), value, unit, str(tok)), self.L(meta))
        if tok.type == "NUMBER":
            return (str(c[0]), ast.Num(self.L(meta), float(tok), "", str(tok)), self.L(meta))
        return (str(c[0]), str(tok), self.L(meta))

    @v_args(meta=True)
    def set_decl(self, meta, c):
        return ast.SetDecl(self.L(meta), self.at(c[0]), c[1], c[2])

    @v_args(meta=True)
    def param_decl(self, meta, c):
        value = c[2]
        if value is None:
            return ast.ParamDecl(self.L(meta), self.at(c[0]), c[1], None, False)
        kind, expr = value
        return ast.ParamDecl(self.L(meta), self.at(c[0]), c[1], expr, kind == "default")

    def param_is(self, c):
        return ("is", c[0])

    def param_default(self, c):
        return ("default", c[0])

    @v_args(meta=True)
    def var_decl(self, meta, c):
        name, index, (kind, lb, ub), doc = c
        return ast.VarDecl(self.L(meta), self.at(name), index, kind, lb, ub,
                           _unescape(doc) if doc else "")

    def vt_binary(self, c):
        return ("binary", None, None)

    def vt_integer(self, c):
        return ("integer",) + (c[0] if c and c[0] else (None, None))

    def vt_continuous(self, c):
        return ("continuous",) + (c[0] if c and c[0] else (None, None))

    def vt_in(self, c):
        return ("continuous",) + c[0]

    def bounds(self, c):
        return (c[0], c[1])

    @v_args(meta=True)
    def expr_decl(self, meta, c):
        return ast.ExprDecl(self.L(meta), self.at(c[0]), c[1], c[2])

    @v_args(meta=True)
    def constraint_decl(self, meta, c):
        return ast.ConstraintDecl(self.L(meta), self.at(c[0]), c[1], c[2], _unescape(c[3]) if c[3] else "")

    @v_args(meta=True)
    def expr_ext(self, meta, c):
        return ast.Extension(self.L(meta), self.at(c[0]), c[1], "", c[2])

    @v_args(meta=True)
    def constraint_ext(self, meta, c):
        return ast.Extension(self.L(meta), self.at(c[0]), c[1], str(c[2]), c[3])

    def side(self, c):
        return self.at(c[0])

    @v_args(meta=True)
    def when_decl(self, meta, c):
        cond, decl = c
        return dataclasses.replace(decl, when=cond, loc=decl.loc)

    @v_args(meta=True)
    def objective_decl(self, meta, c):
        sense, name, op, body = c
        return ast.ObjectiveDecl(self.L(meta), "min" if sense == "minimize" else "max",
                                 self.at(name), body, extend=(op == "+="))

    def sense(self, c):
        return str(c[0])

    def obj_op(self, c):
        return self.at(c[0])

    @v_args(meta=True)
    def index(self, meta, c):
        where = c[-1] if c and isinstance(c[-1], _Where) else None
        items = [x for x in c if not isinstance(x, _Where)]
        return ast.Index(self.L(meta), items, where.expr if where else None)

    def where(self, c):
        return _Where(c[0])

    # --- expressions
    @v_args(meta=True)
    def implies(self, meta, c):
        return ast.Logic(self.L(meta), "implies", c[0], c[1])

    @v_args(meta=True)
    def iff(self, meta, c):
        return ast.Logic(self.L(meta), "iff", c[0], c[1])

    @v_args(meta=True)
    def or_(self, meta, c):
        return ast.Logic(self.L(meta), "or", c[0], c[1])

    @v_args(meta=True)
    def and_(self, meta, c):
        return ast.Logic(self.L(meta), "and", c[0], c[1])

    @v_args(meta=True)
    def not_(self, meta, c):
        return ast.Not(self.L(meta), c[0])

    @v_args(meta=True)
    def compare(self, meta, c):
        return ast.Compare(self.L(meta), c[1], c[0], c[2])

    def comp(self, c):
        return self.at(c[0])

    @v_args(meta=True)
    def member(self, meta, c):
        return ast.Member(self.L(meta), c[0], c[1], False)

    @v_args(meta=True)
    def not_member(self, meta, c):
        return ast.Member(self.L(meta), c[0], c[1], True)

    @v_args(meta=True)
    def range_(self, meta, c):
        return ast.Range(self.L(meta), c[0], c[1])

    @v_args(meta=True)
    def binop(self, meta, c):
        return ast.BinOp(self.L(meta), c[1], c[0], c[2])

    def addop(self, c):
        return self.at(c[0])

    def mulop(self, c):
        return self.at(c[0])

    @v_args(meta=True)
    def neg_(self, meta, c):
        return ast.Neg(self.L(meta), c[0])

    @v_args(meta=True)
    def number(self, meta, c):
        return ast.Num(self.L(meta), float(c[0]), "", str(c[0]))

    @v_args(meta=True)
    def quantity(self, meta, c):
        value, unit = _split_number(str(c[0]))
        return ast.Num(self.L(meta), value, unit, str(c[0]))

    @v_args(meta=True)
    def string(self, meta, c):
        return ast.Str(self.L(meta), _unescape(c[0]))

    @v_args(meta=True)
    def name(self, meta, c):
        return ast.Name(self.L(meta), str(c[0]))

    @v_args(meta=True)
    def subscript(self, meta, c):
        return ast.Subscript(self.L(meta), str(c[0]), list(c[1:]))

    @v_args(meta=True)
    def call(self, meta, c):
        return ast.Call(self.L(meta), str(c[0]), [x for x in c[1:] if x is not None])

    @v_args(meta=True)
    def aggregate(self, meta, c):
        op, *rest = c
        body = rest[-1]
        middle = rest[:-1]
        where = middle[-1] if middle and isinstance(middle[-1], _Where) else None
        items = [x for x in middle if not isinstance(x, _Where) and x is not None]
        return ast.Aggregate(self.L(meta), op, items, where.expr if where else None, body)

    def agg(self, c):
        return str(c[0])

    @v_args(meta=True)
    def tuple_(self, meta, c):
        return ast.Tuple(self.L(meta), list(c))

    @v_args(meta=True)
    def set_lit(self, meta, c):
        where = c[-1] if c and isinstance(c[-1], _Where) else None
        items = [x for x in c if x is not None and not isinstance(x, _Where)]
        return ast.SetLit(self.L(meta), items, where.expr if where else None)

    @v_args(meta=True)
    def set_for(self, meta, c):
        where = c[-1] if isinstance(c[-1], _Where) else None
        items = [x for x in c[1:] if x is not None and not isinstance(x, _Where)]
        return ast.SetFor(self.L(meta), c[0], items, where.expr if where else None)

    @v_args(meta=True)
    def table(self, meta, c):
        return ast.Table(self.L(meta), list(c))

    def pair(self, c):
        return (c[0], c[1])

    @v_args(meta=True)
    def cond(self, meta, c):
        return ast.Cond(self.L(meta), c[0], c[1], c[2])

    # --- graph data
    def _value(self, tok: Token) -> ast.Value:
        loc = Loc(self.path, tok.line or 0, tok.column or 0)  # lark sets both on every token
        if tok.type == "QUANTITY":
            value, unit = _split_number(str(tok))
            return ast.Value(loc, value, unit, str(tok))
        return ast.Value(loc, float(tok), "", str(tok))

    @v_args(meta=True)
    def graph_decl(self, meta, c):
        name, title, *items = c
        return ast.GraphDecl(self.L(meta), str(name), _unescape(title) if title else "", items)

    @v_args(meta=True)
    def node_stmt(self, meta, c):
        name, kind, *attrs = c
        time = size = None
        for key, value in attrs:
            if key == "time":
                time = value
            else:
                size = value
        return ast.NodeStmt(self.L(meta), name, kind or "forward", time, size)

    def node_kind(self, c):
        return str(c[0])

    def node_time(self, c):
        return ("time", self._value(c[0]))

    def node_size(self, c):
        return ("size", self._value(c[0]))

    @v_args(meta=True)
    def edge_stmt(self, meta, c):
        return ast.EdgeStmt(self.L(meta), c[0], list(c[1:]))

    @v_args(meta=True)
    def data_stmt(self, meta, c):
        return ast.DataStmt(self.L(meta), c[0], self._value(c[1]), c[2] or "", c[3] is not None)

    def data_role(self, c):
        return str(c[0])

    @v_args(meta=True)
    def layer_stmt(self, meta, c):
        name, inputs, outputs, *rest = c
        grad = next((x for x in rest if isinstance(x, tuple)), ([], []))
        options = [x for x in rest if isinstance(x, ast.OptionStmt)]
        return ast.LayerStmt(self.L(meta), name, inputs, outputs, grad[0], grad[1], options)

    def grad_stmt(self, c):
        return (c[0], c[1])

    @v_args(meta=True)
    def option_stmt(self, meta, c):
        opt = ast.OptionStmt(self.L(meta), c[0])
        for part in c[1:]:
            if part is None:
                continue
            key, value, extra = part
            if key == "fwd":
                opt.fwd, opt.fwd_overhead = value, extra
            elif key == "bwd":
                opt.bwd, opt.bwd_overhead = value, extra
            elif key == "phantom":
                opt.phantom = value
            elif key == "fwd_steps":
                opt.fwd_steps = value
            elif key == "bwd_steps":
                opt.bwd_steps = value
            elif key == "pinned":
                opt.pinned = True
            elif key == "segments":
                opt.segments = value
            else:
                opt.needs = value
        return opt

    def fwd_part(self, c):
        return ("fwd", self._value(c[0]), c[1])

    def bwd_part(self, c):
        return ("bwd", self._value(c[0]), c[1])

    def overhead(self, c):
        return self._value(c[0])

    def phantom_part(self, c):
        return ("phantom", self._value(c[0]), None)

    def fwd_steps(self, c):
        return ("fwd_steps", list(c), None)

    def bwd_steps(self, c):
        return ("bwd_steps", list(c), None)

    @v_args(meta=True)
    def segments_part(self, meta, c):
        return ("segments", ast.SegmentsStmt(self.L(meta), _unescape(str(c[0])), c[1]), None)

    def segment_list(self, c):
        return list(c)

    @v_args(meta=True)
    def segment(self, meta, c):
        kind, first, last, children = c
        return ast.SegmentStmt(self.L(meta), self.at(kind), self._value(first),
                               None if last is None else self._value(last), children or [])

    @v_args(meta=True)
    def step(self, meta, c):
        return ast.StepStmt(self.L(meta), self._value(c[0]), c[1] or [], c[2] or [])

    def step_frees(self, c):
        return c[0]

    def step_creates(self, c):
        return c[0]

    def pinned(self, c):
        return ("pinned", True, None)

    def needs_part(self, c):
        return ("needs", c[0], None)

    @v_args(meta=True)
    def loss_stmt(self, meta, c):
        time = self._value(c[2]) if len(c) > 2 and c[2] is not None else None
        return ast.LossStmt(self.L(meta), c[0], c[1], time)

    def names(self, c):
        return [x for x in c if x is not None]

    def gname_name(self, c):
        tok = c[0]
        return _GName(str(tok), Loc(self.path, tok.line, tok.column))

    def gname_string(self, c):
        tok = c[0]
        return _GName(_unescape(str(tok)), Loc(self.path, tok.line, tok.column))

    @v_args(meta=True)
    def budget_decl(self, meta, c):
        return ast.BudgetDecl(self.L(meta), self.at(c[0]), self._value(c[1]))

    @v_args(meta=True)
    def bandwidth_decl(self, meta, c):
        tok = c[1]
        loc = Loc(self.path, tok.line, tok.column)
        if tok.type == "RATE":
            value, unit = _split_number(str(tok)[:-2])
            value = ast.Value(loc, value, unit + "/s", str(tok))
        elif tok.type == "NAME":  # `inf`; any other name is reported by graphdata.bandwidth_value
            value = ast.Value(loc, float("inf"), "B/s" if str(tok) == "inf" else "?", str(tok))
        else:
            value = ast.Value(loc, float(tok), "", str(tok))
        return ast.BandwidthDecl(self.L(meta), self.at(c[0]), value)


class _Where:
    def __init__(self, expr):
        self.expr = expr


class _GName(str):
    """A name (or an operator) that remembers where it was written: a plain str everywhere else.

    Declaration names, graph-data names and binary operators carry one, so that an error can
    point at the offending token rather than at the start of its declaration or expression.
    """

    loc: Loc | None

    def __new__(cls, value: str, loc: Loc | None = None):
        obj = super().__new__(cls, value)
        obj.loc = loc
        return obj

    def __reduce__(self):
        return (_GName, (str(self), self.loc))


def name_loc(name, default: Loc) -> Loc:
    return getattr(name, "loc", None) or default


def parse_text(text: str, path: str = "<input>") -> ast.Module:
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, path) from None
    return _Builder(path).transform(tree)


def parse_file(path, loc: Loc | None = None) -> ast.Module:
    """The AST of a `.sched` file; a file that cannot be read (missing, a folder, a FIFO, a
    name too long, not UTF-8) is a `SyntaxProblem` located at `loc` (a `use` statement), else
    at the path."""
    try:
        p = readable_file(path, loc, "model file")
        stat = p.stat()
        return _parse_file_cached(str(path), stat.st_mtime_ns, stat.st_size)
    except DataError as exc:
        raise SyntaxProblem(exc.message, exc.loc) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.reason if isinstance(exc, UnicodeDecodeError) else (exc.strerror or exc)
        raise SyntaxProblem(f"cannot read file: {why}", loc or Loc(str(path))) from None


@functools.lru_cache(maxsize=64)
def _parse_file_cached(path: str, mtime_ns: int, size: int) -> ast.Module:
    # Shipped models are read again by every load(); ASTs are never mutated, so a file that
    # has not changed (same mtime and size) is parsed once per process.
    from pathlib import Path

    return parse_text(Path(path).read_text(), path)


def _syntax_error(exc: UnexpectedInput, text: str, path: str) -> SyntaxProblem:
    loc = Loc(path, getattr(exc, "line", 0) or 0, getattr(exc, "column", 0) or 0)
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        expected_terms = set(exc.accepts or exc.expected)
        if tok.type == "$END":
            got = "end of file"
            lines = text.splitlines() or [""]
            loc = Loc(path, len(lines), len(lines[-1]) + 1)
            pos = len(text)
        else:
            got = f"'{tok}'"
            pos = tok.start_pos if tok.start_pos is not None else len(text)
        if tok.type == "MINUS" and expected_terms <= {"NUMBER", "QUANTITY"}:
            return SyntaxProblem("a value in graph data cannot be negative: sizes, times and budgets "
                                 "are written without a sign", loc)
        message = f"unexpected {got}; expected {_one_of(_expected(expected_terms))}"
        if tok.type == "EQUAL" and "'=='" in {_pretty(t) for t in expected_terms}:
            after = text[pos + 1:pos + 2]
            message += {">": "; write '>=' for 'at least'", "<": "; write '<=' for 'at most'"}.get(
                after, "; write '==' to compare")
        opened = _unclosed_bracket(text, pos)
        if opened is not None and _CLOSER[opened[0]] in expected_terms:
            char, line, col = opened
            message += f" (the '{char}' at {line}:{col} is not closed)"
        return SyntaxProblem(message, loc)
    if isinstance(exc, UnexpectedCharacters):
        at = exc.pos_in_stream
        char = text[at] if at is not None and 0 <= at < len(text) else "?"
        if char == '"':
            return SyntaxProblem('unterminated string: a string must end with \'"\' on the same line', loc)
        return SyntaxProblem(f"unexpected character '{char}'{_CHAR_HINTS.get(char, '')}", loc)
    if isinstance(exc, UnexpectedEOF):
        return SyntaxProblem("unexpected end of file", loc)
    return SyntaxProblem(str(exc).splitlines()[0], loc)


_CHAR_HINTS = {
    "'": "; strings are written in double quotes", "&": "; write 'and'", "|": "; write 'or'",
    "!": "; write 'not', or '!=' for 'not equal'", ";": "; statements need no separator",
}
_CLOSER = {"(": "RPAR", "[": "RSQB", "{": "RBRACE"}
# What may start an expression, and the binary operators: listed one by one, they drown the
# part of an "expected ..." list that tells the user what is missing.
_EXPR_START = {"NAME", "NUMBER", "QUANTITY", "STRING", "LPAR", "LBRACE", "MINUS", "NOT", "IF",
               "SUM", "ANY", "ALL", "MAX", "MIN", "LHS", "RHS"}
_DECL_START = {"MODEL", "USE", "DROP", "DECODE", "SET", "PARAM", "VAR", "EXPR", "CONSTRAINT",
               "MINIMIZE", "MAXIMIZE", "GRAPH", "BUDGET", "BANDWIDTH", "WHEN", "$END"}
_OPERATORS = {"+", "-", "*", "/", "union", "diff", "inter", "and", "or", "implies", "iff",
              "<=", ">=", "==", "!=", "<", ">", "..", "in", "not"}


def _expected(terms: set[str]) -> list[str]:
    """The expected terminals as a user would read them: closing brackets and separators first."""
    terms = set(terms)
    tail = []
    if {"NAME", "NUMBER", "LPAR"} <= terms:
        terms -= _EXPR_START
        tail.append("an expression")
    ops = {t for t in terms if _pretty(t).strip("'") in _OPERATORS}
    if len(ops) >= 3:
        terms -= ops
        tail.append("an operator")
    decls = {t for t in terms if t in _DECL_START}
    if len(decls) >= 3:
        terms -= decls
        tail.append("a new declaration")
    first = ["RPAR", "RSQB", "RBRACE", "COMMA", "COLON"]
    head = [_pretty(t) for t in first if t in terms]
    rest = sorted(_pretty(t) for t in terms if t not in first)
    return head + rest + tail


def _unclosed_bracket(text: str, end: int) -> tuple[str, int, int] | None:
    """The innermost bracket opened before `end` and not closed by then (strings and comments
    skipped), as (char, line, column)."""
    stack: list[tuple[str, int, int]] = []
    line, col, i = 1, 1, 0
    while i < min(end, len(text)):
        ch = text[i]
        if ch == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if ch == '"':
            j = i + 1
            while j < len(text) and text[j] not in '"\n':
                j += 2 if text[j] == "\\" else 1
            col += j + 1 - i
            i = j + 1
            continue
        if ch in "([{":
            stack.append((ch, line, col))
        elif ch in ")]}" and stack:
            stack.pop()
        if ch == "\n":
            line, col = line + 1, 1
        else:
            col += 1
        i += 1
    return stack[-1] if stack else None


def _one_of(items: list[str]) -> str:
    if len(items) <= 1:
        return items[0] if items else "something else"
    if len(items) > 8:
        return ", ".join(items[:8]) + ", ..."
    return ", ".join(items[:-1]) + " or " + items[-1]
