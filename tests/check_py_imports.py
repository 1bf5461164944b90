#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""No circles between the Python package's modules (clients/python/kvpool).

An edge is an import that runs: at module level or inside a function
(a lazy import is still a circle, only a later one), of a module of the
package (relative, or absolute `kvpool.x`). Imports under `if
TYPE_CHECKING:` are for the type checker alone and are not edges. Prints
each circle, as vLLM's v1/core would be read (a -> b -> a); exit 1 if any.

    python3 tests/check_py_imports.py SOURCE_DIR
"""
import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_cycles import strong_components  # noqa: E402


def _type_checking(node):
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _edges(path, mods):
    """The package modules this file imports when it runs."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level == 1:
                    base = child.module or ""
                    names = [base] if base else [a.name for a in child.names]
                elif child.level == 0 and (child.module or "").startswith("kvpool"):
                    base = child.module[len("kvpool"):].lstrip(".")
                    names = [base] if base else [a.name for a in child.names]
                else:
                    names = []
                out.update(n.split(".")[0] for n in names if n.split(".")[0] in mods)
            elif isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.startswith("kvpool."):
                        n = a.name.split(".")[1]
                        if n in mods:
                            out.add(n)
            visit(child)
    visit(tree)
    return out


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    pkg = os.path.join(argv[1], "clients", "python", "kvpool")
    files = {f[:-3]: os.path.join(pkg, f) for f in os.listdir(pkg) if f.endswith(".py")}
    mods = set(files) - {"__init__"}
    graph = {m: _edges(p, mods) - ({m} if m == "__init__" else set())
             for m, p in files.items()}
    circles = [sorted(c) for c in strong_components(graph, self_loops=True)]
    for c in circles:
        print("check_py_imports: kvpool modules import each other in a circle: " +
              " -> ".join(c + c[:1]), file=sys.stderr)
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
