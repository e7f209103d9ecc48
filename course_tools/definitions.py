"""Which learner cells the grader runs: definitions only.

During ``nbgrader autograde`` the tests run in the same kernel as the learner's cells, so a
cell that *runs* code at the top level could rewrite the tests' helpers, install an input
transformer that turns every later cell into ``pass``, or read what the grader holds. The
course's execute step (:mod:`course_tools.autograde`) therefore runs a learner cell only if
it holds nothing but definitions, which execute no code of the learner's when run:

* ``import x`` / ``from x import y`` (absolute; a few standard modules whose import opens a
  browser or a window are refused). In the sandbox nothing on ``sys.path`` is writable, so an
  import can only load what the course's environment installed;
* ``def`` statements, without decorators or annotations, whose default values are literals;
* ``class`` statements without decorators, bases or keywords, whose bodies hold only such
  ``def`` statements, docstrings and literal assignments;
* docstrings, ``pass``, and assignments of literals (``N = 3``) to plain names.

A function's *body* may hold anything: it runs later, in a worker process, when a test calls it.
:func:`problems` says what a cell holds beyond that, in words for the learner.
"""

from __future__ import annotations

import ast

__all__ = ["problems", "bound_names", "RULE"]

#: Standard-library modules whose import does something (opens a browser, a window, prints).
_REFUSED_MODULES = frozenset({"antigravity", "this", "idlelib", "turtle", "turtledemo", "tkinter",
                              "__hello__", "__phello__", "webbrowser", "pdb", "code", "pydoc"})
RULE = ("During grading an answer cell may hold only definitions: imports, `def` and `class` "
        "statements, docstrings and assignments of plain values (N = 3). Code at the top level of "
        "the cell, decorators, annotations and computed default values are not run, because "
        "they would run inside the grader; put your code inside the function.")


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _where(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


def _function(node, out: list[str], inside: str = "") -> None:
    what = f"{inside}{node.name}()"
    if node.decorator_list:
        out.append(f"{_where(node)}: the decorator on {what}")
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    if node.returns is not None or any(a.annotation is not None for a in every):
        out.append(f"{_where(node)}: the annotations of {what}")
    defaults = list(args.defaults) + [d for d in args.kw_defaults if d is not None]
    if not all(_literal(d) for d in defaults):
        out.append(f"{_where(node)}: a default value of {what} that is not a plain value")
    if _dunder(node.name) and not inside:
        out.append(f"{_where(node)}: the name {node.name}")


def _module_ok(name: str) -> bool:
    return name.split(".")[0] not in _REFUSED_MODULES


def problems(source: str) -> list[str]:
    """What the cell holds beyond definitions, one entry per problem (empty: it may run)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"line {e.lineno}: it is not plain Python ({e.msg}); notebook commands such as "
                "`!pip` or `%time` are not run either"]
    except (ValueError, RecursionError, MemoryError) as e:
        return [f"it cannot be read as Python ({type(e).__name__})"]
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [f"{_where(node)}: import {a.name}" for a in node.names if not _module_ok(a.name)]
            out += [f"{_where(node)}: the name {a.asname}" for a in node.names
                    if a.asname and _dunder(a.asname)]
        elif isinstance(node, ast.ImportFrom):
            if node.level or not node.module or not _module_ok(node.module):
                out.append(f"{_where(node)}: from {'.' * node.level}{node.module or ''} import ...")
            out += [f"{_where(node)}: the name {a.asname or a.name}" for a in node.names
                    if _dunder(a.asname or a.name)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _function(node, out)
        elif isinstance(node, ast.ClassDef):
            if node.decorator_list or node.bases or node.keywords:
                out.append(f"{_where(node)}: the decorators, base classes or keywords of class {node.name}")
            if _dunder(node.name):
                out.append(f"{_where(node)}: the name {node.name}")
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    _function(item, out, inside=f"{node.name}.")
                elif isinstance(item, ast.Pass) or (isinstance(item, ast.Expr)
                                                    and isinstance(item.value, ast.Constant)):
                    continue
                elif (isinstance(item, ast.Assign) and _literal(item.value)
                      and all(isinstance(t, ast.Name) and not _dunder(t.id) for t in item.targets)):
                    continue
                else:
                    out.append(f"{_where(item)}: code in the body of class {node.name}")
        elif isinstance(node, ast.Assign):
            names = all(isinstance(t, ast.Name) and not _dunder(t.id) for t in node.targets)
            if not (names and _literal(node.value)):
                out.append(f"{_where(node)}: an assignment that is not `name = plain value`")
        elif isinstance(node, ast.Pass) or (isinstance(node, ast.Expr)
                                            and isinstance(node.value, ast.Constant)):
            continue
        else:
            out.append(f"{_where(node)}: top-level code ({type(node).__name__.lower()})")
    return out


def bound_names(source: str) -> list[str]:
    """The names a cell would define (functions, classes, assignments), as far as it parses."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return [n for n in names if n.isidentifier() and not _dunder(n)]
