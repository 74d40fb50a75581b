"""`$(VAR)` expansion in container command, args, env values and subPathExpr (pure).

The kubelet expands these with k8s.io/kubernetes
`third_party/forked/golang/expansion` (`Expand` with `MappingFuncFor`), and
users rely on its exact quirks, so this is a transcription of it rather than a
regular expression:

* `$$` is an escaped `$` (so `$$(A)` is the literal `$(A)`);
* `$(NAME)` is replaced by NAME's value when NAME is defined, and left as
  `$(NAME)` when it is not;
* the name runs to the *first* `)`: a nested `$(A$(B))` reads the name
  `A$(B`, which no environment defines, so it stays as written (B is not
  expanded inside it) and the last `)` is a literal;
* `$(` without a closing `)`, a `$` before any other character, and a `$` at
  the end stay literal.
"""

from __future__ import annotations

from collections.abc import Mapping

OPERATOR, OPENER, CLOSER = "$", "(", ")"


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Expand `$(VAR)` references in `text` from `env`, exactly as the kubelet does."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    n = len(text)
    while cursor < n:
        if text[cursor] == OPERATOR and cursor + 1 < n:
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == OPERATOR:  # escaped operator
                out.append(OPERATOR)
                advance = 1
            elif rest[0] == OPENER:
                close = rest.find(CLOSER, 1)
                if close == -1:  # incomplete reference: the two characters stay
                    out.append(OPERATOR + OPENER)
                    advance = 1
                else:
                    name = rest[1:close]
                    out.append(env[name] if name in env else f"{OPERATOR}{OPENER}{name}{CLOSER}")
                    advance = close + 1
            else:  # an operator that starts no expression
                out.append(OPERATOR + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)
