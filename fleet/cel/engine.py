"""Compile and evaluate CEL expressions, bounded: the engine behind every CEL field.

Kubernetes compiles CEL with cel-go, type-checks it against the declared
variables and bounds it with a static cost estimate and a runtime cost budget.
Fleet uses cel-python (`celpy`, a pure-Python interpreter of the same language)
and adds what the API server needs around it:

- `compile(expression, variables)` parses once and checks, before any request
  is judged, what can be checked without types: the syntax, references to
  undeclared variables, calls of functions that do not exist, the size and the
  nesting depth of the expression.  Errors read as cel-go words them
  (`ERROR: <input>:1:5: Syntax error: ...` with the source line and a caret),
  so field errors match kube-apiserver's `compilation failed: ...`.
  There is no static type checking: `object.spec.replicas + 'a'` compiles and
  fails when evaluated (kube refuses it at creation).
- `evaluate(program, activation)` runs the interpreter with a *step budget*:
  every AST node the interpreter visits (each element a macro iterates over
  visits its sub-expression again) costs one step; a run over `STEP_LIMIT`
  steps, or longer than `TIME_LIMIT` seconds of wall clock, stops with kube's
  message `operation cancelled: actual cost limit exceeded`.  Steps are not
  cel-go's cost units (those weigh string sizes and list traversals); they bound
  the same thing, the work done per expression.  Built-in functions run to
  completion once called (regular expressions are RE2, linear as in cel-go) —
  the wall-clock limit is checked between steps only.
- Whatever goes wrong — a missing key (`no such key: x`), a type mismatch
  (`no matching overload`), a bug in the interpreter — comes out as `EvalError`
  with a message, never as another exception.

Compiled programs are cached by (expression, variables): objects holding CEL
are re-read on every watch event and requests evaluate the same few expressions
over and over.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import Activation, CELEvalError, Evaluator

from fleet.cel import _speedup
from fleet.cel.library import FUNCTIONS, to_cel, to_json

_speedup.install()

# Limits (documented in the module docstring and docs/fragments/cel.md).
MAX_EXPRESSION_LENGTH = 100_000  # code points; cel-go's default parser expression size limit
MAX_AST_NODES = 20_000
MAX_AST_DEPTH = 400  # tree levels after collapsing (an `a || b || ...` chain: one per operator);
#                      the interpreter recurses ~5 Python frames per level, celpy allows 2500
STEP_LIMIT = 1_000_000  # kube's per-expression PerCallLimit, in interpreter steps
TIME_LIMIT = 0.25  # seconds of wall clock per evaluation (checked every 64 steps)
COST_EXCEEDED = "operation cancelled: actual cost limit exceeded"

# The comprehension macros: the first argument names the variable bound in the others.
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
# Global functions and methods celpy provides itself, and the macros it treats as such.
# (Not celpy's non-standard `reduce` macro: an expression kube-apiserver would refuse must not compile.)
_CELPY_FUNCTIONS = frozenset(celpy.evaluation.base_functions) | {"has", "dyn", "min"} | MACROS
KNOWN_FUNCTIONS = _CELPY_FUNCTIONS | frozenset(FUNCTIONS)


class CompileError(Exception):
    """The expression does not compile; `str()` is cel-go's `ERROR: <input>:L:C: ...` text."""


class EvalError(Exception):
    """Evaluating the expression failed (a runtime error or the budget ran out)."""


@dataclass(frozen=True)
class Program:
    """A compiled expression: its (simplified) parse tree, its size, the variables it may use."""

    expression: str
    ast: lark.Tree
    variables: frozenset[str]
    nodes: int


class _Exhausted(BaseException):
    """The budget ran out (a BaseException: celpy turns Exceptions into CEL errors)."""


class _Budget(threading.local):
    """The budget of the evaluation running on this thread (`active` False: none running)."""

    steps = 0
    limit = 0
    deadline = 0.0
    active = False


_BUDGET = _Budget()


_UNSET = object()


class _BoundedEvaluator(Evaluator):
    """celpy's tree-walking evaluator, charging one step per AST node it visits."""

    def _visit_tree(self, tree: lark.Tree) -> Any:
        # lark's Interpreter._visit_tree without its visit_wrapper probe (celpy has none).
        b = _BUDGET
        if b.active:
            b.steps += 1
            if b.steps > b.limit or (b.steps & 63 == 0 and time.monotonic() > b.deadline):
                raise _Exhausted
        return getattr(self, tree.data)(tree)

    def literal(self, tree: lark.Tree) -> Any:
        # A literal's value never changes: convert the token once, kept on the tree node.
        value = getattr(tree, "_fleet_value", _UNSET)
        if value is _UNSET:
            value = super().literal(tree)
            if not isinstance(value, CELEvalError):
                tree._fleet_value = value  # type: ignore[attr-defined]
        return value

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:
        return _MacroEvaluator(ast, activation=self.activation)

    def member_dot_arg(self, tree: lark.Tree) -> Any:
        # celpy iterates a comprehension's target without checking it is a list or map: a
        # Python TypeError would escape CEL's error handling (and `||`'s short-circuit).
        try:
            return super().member_dot_arg(tree)
        except (TypeError, AttributeError, IndexError) as e:
            name = tree.children[1] if len(tree.children) > 1 else "?"
            return CELEvalError(f"no such overload: {name}", TypeError, (str(e),))


class _MacroEvaluator(_BoundedEvaluator):
    """The body of a comprehension, run once per element: the element is bound in a
    nested activation (celpy clones the whole activation per element, which made each
    element cost more than a whole simple expression)."""

    _nested: Activation | None = None

    def set_activation(self, values: Any) -> Evaluator:
        # One nested activation per comprehension run, its variable rebound per element
        # (elements are evaluated one after the other; celpy's macros consume eagerly).
        if self._nested is None:
            self._nested = self.base_activation.nested_activation(vars=values)
        else:
            self._nested.identifiers.load_values(values)
        self.activation = self._nested
        return self


# The grammar's precedence levels: a node of these with a single child only passes its
# child's value up (celpy's methods return `values[0]`), so compile() drops it.
_PASS_THROUGH = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition",
                           "multiplication", "unary", "member"})


def _collapse(tree: lark.Tree) -> lark.Tree:
    """Drop the pass-through levels (typically 8 per operand): evaluation visits ~5x fewer
    nodes.  Iterative, in place."""
    stack = [tree]
    while stack:
        t = stack.pop()
        # Rule names as plain str: celpy compares them with strings at every node, and
        # lark's Token.__eq__ is Python code.
        t.data = str(t.data)
        for i, c in enumerate(t.children):
            while (isinstance(c, lark.Tree) and c.data in _PASS_THROUGH and len(c.children) == 1
                   and isinstance(c.children[0], lark.Tree)):
                c = c.children[0]
            if isinstance(c, lark.Tree):
                t.children[i] = c
                stack.append(c)
    while (tree.data in _PASS_THROUGH and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree)):
        tree = tree.children[0]
    tree.data = str(tree.data)
    return tree


# --------------------------------------------------------------------------- compile

def _error_text(expression: str, line: int, column: int, message: str) -> str:
    """cel-go's error format: location, message, the source line and a caret."""
    lines = expression.splitlines() or [""]
    src = lines[line - 1] if 0 < line <= len(lines) else lines[-1]
    return f"ERROR: <input>:{line}:{column}: {message}\n | {src}\n | {'.' * max(column - 1, 0)}^"


def _syntax_error(expression: str, e: CELParseError) -> str:
    line, column = e.line or 1, e.column or 1
    detail = ""
    cause = e.__context__
    token = getattr(cause, "token", None)
    if token is not None:
        detail = f"mismatched input '{token}'" if str(token) else "mismatched input '<EOF>'"
        expected = sorted(getattr(cause, "expected", None) or ())
        if expected:
            detail += " expecting {" + ", ".join(expected[:8]) + ("" if len(expected) <= 8 else ", ...") + "}"
    elif cause is not None and getattr(cause, "char", None):
        detail = f"token recognition error at: '{cause.char}'"
    else:
        detail = str(e.args[0]).splitlines()[0] if e.args else "syntax error"
    if token is not None and not str(token):
        line, column = _end(expression)
    return _error_text(expression, line, column, f"Syntax error: {detail}")


def _end(expression: str) -> tuple[int, int]:
    lines = expression.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


def _pos(tree: Any) -> tuple[int, int]:
    meta = getattr(tree, "meta", None)
    if meta is not None and not getattr(meta, "empty", True):
        return meta.line, meta.column
    if isinstance(tree, lark.Token) and tree.line is not None:
        return tree.line, tree.column or 1
    return 1, 1


def _macro_var(arg: lark.Tree) -> str | None:
    """The identifier a comprehension binds (its first argument must be a bare name)."""
    node: Any = arg
    while isinstance(node, lark.Tree) and node.data != "ident":
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return str(node.children[0]) if isinstance(node, lark.Tree) else None


def _check(expression: str, ast: lark.Tree, variables: frozenset[str]) -> int:
    """Static checks; the number of nodes.  Raises CompileError."""
    nodes = 0
    # (tree, bound names, depth) — iterative: an expression may nest deeper than Python recurses.
    stack: list[tuple[Any, frozenset[str], int]] = [(ast, frozenset(), 1)]
    while stack:
        tree, bound, depth = stack.pop()
        if not isinstance(tree, lark.Tree):
            continue
        nodes += 1
        if nodes > MAX_AST_NODES:
            raise CompileError(_error_text(expression, 1, 1, f"expression exceeds the limit of {MAX_AST_NODES} "
                                                             "syntax nodes"))
        if depth > MAX_AST_DEPTH:
            line, col = _pos(tree)
            raise CompileError(_error_text(expression, line, col, "expression nesting exceeds the maximum "
                                                                  "allowed depth"))
        kind = tree.data
        children = tree.children
        if kind == "ident":
            name = str(children[0])
            if name not in variables and name not in bound:
                line, col = _pos(children[0])
                raise CompileError(_error_text(expression, line, col,
                                               f"undeclared reference to '{name}' (in container '')"))
            continue
        if kind == "dot_ident":
            name = str(children[0])
            if name not in variables:
                line, col = _pos(children[0])
                raise CompileError(_error_text(expression, line, col,
                                               f"undeclared reference to '{name}' (in container '')"))
            continue
        if kind == "ident_arg":
            name = str(children[0])
            if name not in KNOWN_FUNCTIONS:
                line, col = _pos(children[0])
                raise CompileError(_error_text(expression, line, col,
                                               f"undeclared reference to '{name}' (in container '')"))
            if name == "has":
                args = children[1].children if len(children) > 1 and isinstance(children[1], lark.Tree) else []
                if len(args) != 1 or not isinstance(args[0], lark.Tree) or args[0].data != "member_dot":
                    line, col = _pos(children[0])
                    raise CompileError(_error_text(expression, line, col + 3, "invalid argument to has() macro"))
        if kind == "member_dot_arg":
            name = str(children[1])
            if name not in KNOWN_FUNCTIONS:
                line, col = _pos(children[1])
                raise CompileError(_error_text(expression, line, col,
                                               f"undeclared reference to '{name}' (in container '')"))
            if name in MACROS:
                args = children[2].children if len(children) > 2 and isinstance(children[2], lark.Tree) else []
                var = _macro_var(args[0]) if len(args) == 2 else None
                if var is None:
                    line, col = _pos(children[1])
                    raise CompileError(_error_text(
                        expression, line, col,
                        f"{name}() macro requires an identifier and an expression (2 arguments)"))
                stack.append((children[0], bound, depth + 1))
                stack.append((args[1], bound | {var}, depth + 2))
                continue
        for c in children:
            stack.append((c, bound, depth + 1))
    return nodes


@functools.lru_cache(maxsize=4096)
def _compile(expression: str, variables: frozenset[str]) -> Program | str:
    if len(expression) > MAX_EXPRESSION_LENGTH:
        return _error_text(expression[:80], 1, 1, f"expression code point size exceeds limit: size: "
                                                  f"{len(expression)}, limit {MAX_EXPRESSION_LENGTH}")
    try:
        ast = _env().compile(expression)
    except CELParseError as e:
        return _syntax_error(expression, e)
    except RecursionError:
        return _error_text(expression, 1, 1, "expression nesting exceeds the maximum allowed depth")
    except Exception as e:  # noqa: BLE001 - the parser must not take the server down
        return _error_text(expression, 1, 1, f"Syntax error: {e}")
    try:
        ast = _collapse(ast)
        nodes = _check(expression, ast, variables)
    except CompileError as e:
        return str(e)
    return Program(expression, ast, variables, nodes)


def _environment() -> celpy.Environment:
    """celpy's environment, with a parser of its own: celpy keeps one parser per process
    (CELParser.CEL_PARSER), built with the tree class of the first environment, which
    need not be ours."""
    saved = CELParser.CEL_PARSER
    CELParser.CEL_PARSER = None
    try:
        env = celpy.Environment()
        parser = CELParser.CEL_PARSER
    finally:
        CELParser.CEL_PARSER = saved if saved is not None else CELParser.CEL_PARSER
    env.compile = lambda text: _parse(parser, text)  # type: ignore[method-assign]
    return env


def _parse(parser: Any, text: str) -> Any:
    try:
        return parser.parse(text)
    except (lark.exceptions.UnexpectedToken, lark.exceptions.UnexpectedCharacters) as ex:
        raise CELParseError(ex.get_context(text), line=ex.line, column=ex.column) from ex


@functools.lru_cache(maxsize=1)
def _env() -> celpy.Environment:
    """Built on first use: building the parser (lark compiling CEL's grammar) takes ~150 ms,
    which processes that never compile CEL (the CLI) should not pay at import."""
    return _environment()


@functools.lru_cache(maxsize=1)
def _base() -> Activation:
    """The activation every evaluation nests its variables in: functions and annotations."""
    return Activation(annotations=_env().annotations, package=None, functions=FUNCTIONS)


def compile(expression: str, variables: Iterable[str]) -> Program:  # noqa: A001 - the CEL verb
    """Compile `expression` for an activation with `variables`; raises CompileError.
    Cached: compiling the same text again costs a dict lookup."""
    out = _compile(expression, frozenset(variables))
    if isinstance(out, str):
        raise CompileError(out)
    return out


def field_references(program: Program, root: str) -> list[tuple[str, int, int]]:
    """The fields selected directly on the variable `root` (`variables.foo` → ("foo", line,
    column)), for callers that know which fields exist (a policy's declared variables)."""
    out: list[tuple[str, int, int]] = []
    for t in program.ast.iter_subtrees():
        if t.data != "member_dot" or len(t.children) != 2:
            continue
        target, field_tok = t.children
        if isinstance(target, lark.Tree) and target.data == "primary" and target.children \
                and isinstance(target.children[0], lark.Tree) and target.children[0].data == "ident" \
                and str(target.children[0].children[0]) == root:
            line, col = _pos(field_tok)
            out.append((str(field_tok), line, max(col - 1, 1)))  # cel-go points at the '.'

    return out


def undefined_field_error(program: Program, root: str, defined: Iterable[str]) -> str | None:
    """cel-go's `undefined field 'x'` for the first field of `root` not in `defined`."""
    known = set(defined)
    for name, line, col in field_references(program, root):
        if name not in known:
            return _error_text(program.expression, line, col, f"undefined field '{name}'")
    return None


def compile_error(expression: str, variables: Iterable[str]) -> str | None:
    """The compile error text of `expression`, or None when it compiles."""
    out = _compile(expression, frozenset(variables))
    return out if isinstance(out, str) else None


# --------------------------------------------------------------------------- evaluate

class LazyMap(celtypes.MapType):
    """A CEL map whose values are computed on first use (a policy's `variables`: each
    evaluated at most once per request, and only if an expression reads it)."""

    def __init__(self, thunks: Mapping[str, Callable[[], Any]]) -> None:
        super().__init__()
        self._thunks = dict(thunks)

    def __getitem__(self, key: Any) -> Any:
        k = str(key)
        if not super().__contains__(celtypes.StringType(k)):
            thunk = self._thunks.get(k)
            if thunk is None:
                raise KeyError(k)
            super().__setitem__(celtypes.StringType(k), thunk())
        return super().__getitem__(celtypes.StringType(k))

    def __contains__(self, key: object) -> bool:
        return str(key) in self._thunks

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


def _message(e: CELEvalError) -> str:
    """kube's words for celpy's errors."""
    args = e.args
    text = str(args[0]) if args else "evaluation error"
    cls = args[1] if len(args) > 1 else None
    if text.startswith("undeclared reference to"):
        m = re.match(r"undeclared reference to '?([^' ]+)'?", text)
        return f"undeclared reference to '{m.group(1) if m else '?'}'"
    if cls is KeyError or "no such member" in text:
        m = re.search(r"'([^']*)'", text)
        return f"no such key: {m.group(1) if m else text}"
    if cls is ZeroDivisionError:
        return "division by zero" if "modulus" not in text or "divide" in text else "modulus by zero"
    if "no matching overload" in text or "no such overload" in text:
        m = re.search(r"(?:Token\('RULE', )?'(\w+)'\)? applied", text)
        return f"no matching overload for '{m.group(1)}'" if m else "no such overload"
    return text


def to_activation(values: Mapping[str, Any]) -> dict[str, Any]:
    """JSON values → CEL values (values already CEL, like a LazyMap, pass as they are)."""
    out: dict[str, Any] = {}
    for k, val in values.items():
        out[k] = val if isinstance(val, (celtypes.MapType, celtypes.ListType)) else to_cel(val)
    return out


def evaluate(program: Program, activation: Mapping[str, Any], *, step_limit: int = STEP_LIMIT,
             time_limit: float = TIME_LIMIT) -> Any:
    """Run `program` over `activation` (CEL values, see `to_activation`); the CEL result.
    Raises EvalError for any failure, including the budget running out.  Re-entrant: a
    lazy variable may evaluate its own program while another one runs (and shares its
    budget)."""
    ev = _BoundedEvaluator(program.ast, activation=_base().nested_activation(vars=dict(activation)))
    b = _BUDGET
    outer = b.active
    if not outer:
        b.active, b.steps, b.limit, b.deadline = True, 0, step_limit, time.monotonic() + time_limit
    try:
        value = ev.visit(program.ast)
    except _Exhausted:
        if outer:
            raise
        raise EvalError(COST_EXCEEDED) from None
    except CELEvalError as e:
        raise EvalError(_message(e)) from None
    except RecursionError:
        raise EvalError("expression nesting exceeds the maximum allowed depth") from None
    except Exception as e:  # noqa: BLE001 - nothing but a clean error leaves the engine
        raise EvalError(f"internal error evaluating expression: {type(e).__name__}: {e}") from None
    finally:
        if not outer:
            b.active = False
    if isinstance(value, CELEvalError):
        raise EvalError(_message(value))
    return value


def evaluate_json(program: Program, activation: Mapping[str, Any], **kw: Any) -> Any:
    """`evaluate` with a JSON activation and a JSON result (tests and simple callers)."""
    return to_json(evaluate(program, to_activation(activation), **kw))
