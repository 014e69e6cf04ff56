"""Size of Python code, by ast: the cyclomatic complexity of a function and the logical lines of a class.

    python tools/code_size.py ep_rt/buffer.py Buffer            # the class's logical lines, each method's complexity

Cyclomatic complexity (McCabe): 1 + one per decision point: if / elif, for, while, except, a conditional expression,
each comprehension's `for` and `if`, each extra operand of `and` / `or`, each `case`; nested functions and lambdas
count in the function that holds them (they are its code). Logical lines: statements (ast.stmt nodes) other than
docstrings, so a call spread over several lines counts once and comments count not at all.
"""

from __future__ import annotations

import ast
import sys


def complexity(fn: ast.AST) -> int:
    n = 1
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp)):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        elif isinstance(node, ast.match_case):
            n += 1
    return n


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def logical_lines(node: ast.AST) -> int:
    return sum(1 for n in ast.walk(node) if isinstance(n, ast.stmt) and not _is_docstring(n)) - 1  # not the def


def report(path: str, cls: str) -> dict:
    tree = ast.parse(open(path, encoding="utf-8").read())
    (c,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    methods = {f.name: complexity(f) for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return {"logical_lines": logical_lines(c), "methods": methods}


if __name__ == "__main__":
    r = report(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[2]}: {r['logical_lines']} logical lines")
    for name, cc in sorted(r["methods"].items(), key=lambda kv: -kv[1]):
        print(f"  {cc:3d}  {name}")
