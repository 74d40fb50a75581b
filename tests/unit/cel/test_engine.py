"""fleet/cel: compile errors in cel-go's words, values, missing fields, the Kubernetes
libraries, the budget, and that nothing but EvalError/CompileError ever leaves it."""

from __future__ import annotations

from typing import Any

import pytest

from fleet import cel

VARS = ("object", "oldObject", "params", "variables")
OBJ = {"metadata": {"name": "web", "labels": {"app": "web"}},
       "spec": {"replicas": 3, "ports": [80, 443], "image": "nginx:1.25", "memory": "512Mi"}}


def run(expr: str, **act: Any) -> Any:
    act.setdefault("object", OBJ)
    return cel.evaluate_json(cel.compile(expr, VARS), act)


def test_syntax_error_text_is_cel_go_shaped() -> None:
    err = cel.compile_error("object.spec.replicas <", VARS)
    assert err is not None
    first, src, caret = err.split("\n")
    assert first.startswith("ERROR: <input>:1:23: Syntax error: mismatched input '<EOF>' expecting ")
    assert src == " | object.spec.replicas <"
    assert caret == " | ......................^"
    err = cel.compile_error("object.spec #", VARS)
    assert err is not None and err.startswith("ERROR: <input>:1:13: Syntax error: token recognition error at: '#'")


def test_undeclared_variables_and_functions_do_not_compile() -> None:
    assert cel.compile_error("self.x > 1", VARS) == (
        "ERROR: <input>:1:1: undeclared reference to 'self' (in container '')\n | self.x > 1\n | ^")
    assert "undeclared reference to 'nope'" in str(cel.compile_error("object.nope()", VARS))
    assert "undeclared reference to 'frob'" in str(cel.compile_error("frob(1)", VARS))
    # Comprehension variables are declared inside their macro only.
    assert cel.compile_error("object.spec.ports.all(p, p > 0)", VARS) is None
    assert "undeclared reference to 'p'" in str(cel.compile_error("object.spec.ports.all(p, p > 0) && p > 1", VARS))
    assert "macro requires" in str(cel.compile_error("object.spec.ports.all(1, true)", VARS))
    assert "invalid argument to has() macro" in str(cel.compile_error("has(object)", VARS))
    assert "invalid argument to has() macro" in str(cel.compile_error("has(object.a, object.b)", VARS))
    assert cel.compile_error("has(object.spec) && has(object['spec'].x)", VARS) is None
    with pytest.raises(cel.CompileError):
        cel.compile("1 +", VARS)


def test_size_and_depth_limits_refuse_absurd_expressions() -> None:
    deep = "(" * 500 + "1" + ")" * 500
    assert "nesting exceeds" in str(cel.compile_error(deep, VARS))
    huge = "[" + ",".join(["[1]"] * 12000) + "] == []"
    assert "syntax nodes" in str(cel.compile_error(huge, VARS))
    # A long chain of || nests one level per operator (cel-python does not balance it).
    assert run(" || ".join(["object.spec.replicas == 1"] * 200)) is False
    assert "nesting exceeds" in str(cel.compile_error(" || ".join(["object.spec.replicas == 1"] * 450), VARS))
    assert "exceeds limit" in str(cel.compile_error("1" + " " * 100_001, VARS))


def test_compile_is_cached() -> None:
    assert cel.compile("object.spec.replicas > 1", VARS) is cel.compile("object.spec.replicas > 1", VARS)


@pytest.mark.parametrize(("expr", "want"), [
    ("object.spec.replicas <= 5", True),
    ("object.metadata.name + '-x'", "web-x"),
    ("object.spec.ports.exists(p, p == 443)", True),
    ("object.spec.ports.map(p, p * 2)", [160, 886]),
    ("object.spec.ports.filter(p, p > 100)", [443]),
    ("size(object.spec.ports)", 2),
    ("'app' in object.metadata.labels", True),
    ("has(object.spec.replicas) && !has(object.spec.paused)", True),
    ("object.spec.image.matches('^nginx:')", True),
    ("object.spec.replicas > 1 ? 'many' : 'one'", "many"),
    ("oldObject == null", True),
])
def test_values(expr: str, want: Any) -> None:
    assert run(expr, oldObject=None) == want


def test_missing_field_is_no_such_key() -> None:
    with pytest.raises(cel.EvalError, match="no such key: paused"):
        run("object.spec.paused == true")
    # Short-circuit: an error on the untaken side of || / && is no error.
    assert run("object.spec.replicas > 1 || object.spec.paused") is True


def test_type_errors_and_division() -> None:
    with pytest.raises(cel.EvalError, match="no matching overload"):
        run("object.spec.replicas + 'a' == 'x'")
    with pytest.raises(cel.EvalError, match="division by zero"):
        run("object.spec.replicas / 0 == 1")


@pytest.mark.parametrize(("expr", "want"), [
    ("'Hello'.lowerAscii()", "hello"), ("'Hello'.upperAscii()", "HELLO"), ("'  x '.trim()", "x"),
    ("'a,b,c'.split(',')", ["a", "b", "c"]), ("'a,b,c'.split(',', 2)", ["a", "b,c"]),
    ("['a', 'b'].join('-')", "a-b"), ("['a', 'b'].join()", "ab"),
    ("'aaa'.replace('a', 'b', 2)", "bba"), ("'hello'.substring(1, 3)", "el"), ("'hello'.substring(3)", "lo"),
    ("'hello'.indexOf('l')", 2), ("'hello'.lastIndexOf('l')", 3), ("'hello'.indexOf('z')", -1),
    ("'hello'.charAt(1)", "e"),
    ("[1, 2, 3].isSorted()", True), ("[3, 1].isSorted()", False), ("[1, 2, 3].sum()", 6), ("[].sum()", 0),
    ("[4, 1, 3].min()", 1), ("[4, 1, 3].max()", 4), ("[1, 2, 1].indexOf(1)", 0), ("[1, 2, 1].lastIndexOf(1)", 2),
    ("'abc 123 de 45'.find('[0-9]+')", "123"), ("'abc 123 de 45'.findAll('[0-9]+')", ["123", "45"]),
    ("'a1b2c3'.findAll('[0-9]', 2)", ["1", "2"]), ("'abc'.find('[0-9]')", ""),
    ("quantity(object.spec.memory).isLessThan(quantity('1Gi'))", True),
    ("quantity('1') == quantity('1000m')", True),
    ("quantity('1.5').isInteger()", False), ("quantity('2k').asInteger()", 2000),
    ("quantity('500m').asApproximateFloat()", 0.5), ("quantity('-1').sign()", -1),
    ("quantity('1Gi').compareTo(quantity('1024Mi'))", 0),
    ("quantity('1').add(quantity('500m')).isGreaterThan(quantity('1.2'))", True),
    ("quantity('1').sub(1).sign()", 0),
    ("isQuantity('10Gi') && !isQuantity('ten')", True),
    ("url('https://example.com:8443/a/b?x=1&x=2').getHost()", "example.com:8443"),
    ("url('https://example.com:8443/a/b?x=1&x=2').getHostname()", "example.com"),
    ("url('https://example.com:8443/a/b?x=1&x=2').getPort()", "8443"),
    ("url('https://example.com:8443/a/b?x=1&x=2').getEscapedPath()", "/a/b"),
    ("url('https://example.com:8443/a/b?x=1&x=2').getQuery()", {"x": ["1", "2"]}),
    ("url('https://[::1]:80/').getHostname()", "::1"),
    ("isURL('https://example.com') && !isURL('not a url')", True),
])
def test_kubernetes_libraries(expr: str, want: Any) -> None:
    assert run(expr) == want


@pytest.mark.parametrize(("expr", "match"), [
    ("'hello'.substring(9) == ''", "index out of range: 9"),
    ("quantity('ten').sign() == 1", "quantities must match"),
    ("[].max() == 1", "must not be empty"),
    ("'x'.find('(') == ''", "error parsing regexp"),
    ("[1, 'a'].sum() == 1", "no such overload"),
    ("object.spec.replicas.lowerAscii() == 'x'", "no such overload"),
    ("url('::') == url('::')", "URL parse error"),
])
def test_library_errors_are_eval_errors(expr: str, match: str) -> None:
    with pytest.raises(cel.EvalError, match=match):
        run(expr)


def test_budget_stops_runaway_comprehensions() -> None:
    big = list(range(2000))
    p = cel.compile("object.all(x, object.all(y, x + y >= 0))", VARS)
    with pytest.raises(cel.EvalError, match="^operation cancelled: actual cost limit exceeded$"):
        cel.evaluate(p, cel.to_activation({"object": big}), step_limit=100_000)
    with pytest.raises(cel.EvalError, match="actual cost limit exceeded"):
        cel.evaluate(p, cel.to_activation({"object": big}), time_limit=0.05)
    # Within budget the same expression runs.
    assert cel.evaluate_json(p, {"object": list(range(10))}) is True


def test_lazy_variables_evaluate_once_on_use() -> None:
    calls: list[str] = []

    def thunk(name: str, value: Any) -> Any:
        def f() -> Any:
            calls.append(name)
            return cel.to_cel(value)
        return f
    act = cel.to_activation({"object": OBJ})
    act["variables"] = cel.LazyMap({"a": thunk("a", 2), "b": thunk("b", 3)})
    p = cel.compile("variables.a * variables.a == 4", VARS)
    assert cel.evaluate(p, act) is not None
    assert calls == ["a"]
    with pytest.raises(cel.EvalError, match="no such key: c"):
        cel.evaluate(cel.compile("variables.c == 1", VARS), act)


@pytest.mark.parametrize("expr", [
    "object.spec.replicas.all(x, x)", "null.exists(x, x)", "true.min()", "dyn(true) >= quantity('1Gi')",
    "object.spec.image > [] != 2.5 && object.spec.nope ? 1 : object.spec.replicas.min()",
])
def test_type_errors_are_no_such_overload(expr: str) -> None:
    with pytest.raises(cel.EvalError) as ei:
        run(expr)
    assert "internal error" not in str(ei.value)
    # And they do not defeat short-circuiting.
    assert run(f"true || ({expr})") is True


@pytest.mark.parametrize("expr", [
    "object.spec.ports[5] == 1", "object.spec.ports['x'] == 1", "object['spec']['replicas'].foo == 1",
    "dyn(object).spec.replicas.all(x, x) == true", "int('x') == 1", "timestamp('nope') == timestamp('x')",
    "object.spec.replicas * 9223372036854775807 > 0", "double('nan') == 1.0", "'abc'.matches('[') == true",
])
def test_nothing_but_eval_error_escapes(expr: str) -> None:
    try:
        run(expr)
    except cel.EvalError:
        pass
