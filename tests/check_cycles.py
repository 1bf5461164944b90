# SPDX-License-Identifier: Apache-2.0
"""Circles between the files of one library or program: file A uses a
function or variable file B defines, and B (directly or around a loop)
uses one of A's. Read from what the linker sees (nm of each object), so a
circle through a shared header's declarations counts as it really is.
Also files that #include each other around a loop.

    python3 tests/check_cycles.py SOURCE_DIR BUILD_DIR

Prints every circle; fails on any but those KNOWN lists (none now), and
on a known one that changed, so the list stays true."""
import collections
import glob
import os
import re
import subprocess
import sys

# Circles not untied yet, each a set of sources: none (issue #61 untied the last).
KNOWN = []
FOLDERS = ("service", "engine", "clients/c")


def objects(src, bld):
    """(source, object) of every object built from FOLDERS whose source still exists."""
    out = []
    for o in glob.glob(os.path.join(bld, "**", "CMakeFiles", "*.dir", "**", "*.o"),
                       recursive=True):
        rel = os.path.relpath(o, bld)
        top, rest = rel.split("/CMakeFiles/", 1)
        target, path = rest.split("/", 1)
        source = os.path.join(top, path[:-2])  # x.c.o -> x.c
        if top.startswith(FOLDERS) and os.path.exists(os.path.join(src, source)):
            out.append((source, o, f"{top}/{target}"))
    return out


def symbols(obj):
    defined, used = set(), set()
    for line in subprocess.run(["nm", "-g", obj], capture_output=True, text=True).stdout.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "TDBRC":
            defined.add(p[2])
        elif len(p) == 2 and p[0] == "U":
            used.add(p[1])
    return defined, used


def circles(src, bld):
    objs = objects(src, bld)
    syms = {s: symbols(o) for s, o, _ in objs}
    target = {s: t for s, _, t in objs}
    owner = {}
    for s, (d, _) in syms.items():
        for x in d:
            owner.setdefault((target[s], x), s)
    edges = collections.defaultdict(set)
    for s, (_, u) in syms.items():
        for x in u:
            o = owner.get((target[s], x))
            if o is not None and o != s:
                edges[s].add(o)
    return strong_components(edges), bool(objs)


def include_circles(src):
    """Files that include each other around a loop (headers: a loop means
    one of them cannot be read alone), over every C and CUDA source."""
    inc = re.compile(r'\s*#\s*include\s+"([^"]+)"')
    graph = {}
    for top in FOLDERS + ("common", "proto", "gpu"):
        for f in glob.glob(os.path.join(src, top, "**", "*.[ch]"), recursive=True) + \
                glob.glob(os.path.join(src, top, "**", "*.cu*"), recursive=True):
            rel = os.path.relpath(f, src)
            edges = graph.setdefault(rel, set())
            with open(f, errors="replace") as fh:
                for line in fh:
                    m = inc.match(line)
                    if m is None:
                        continue
                    for cand in (m.group(1), os.path.join(os.path.dirname(rel), m.group(1))):
                        cand = os.path.normpath(cand)
                        if os.path.exists(os.path.join(src, cand)):
                            edges.add(cand)
                            break
    return strong_components(graph)


def strong_components(graph, self_loops=False):
    """Tarjan's strongly connected components of more than one node (and,
    with self_loops, a node with an edge to itself): each a set."""
    index, low, on, stack, found = {}, {}, set(), [], []
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or (self_loops and v in graph.get(v, ())):
                found.append(comp)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main():
    src, bld = sys.argv[1], sys.argv[2]
    found, any_obj = circles(src, bld)
    if not any_obj:
        print(f"cycles: no objects under {bld} (build first)")
        return 1
    bad = 0
    for c in include_circles(src):
        print(f"cycles: files include each other: {' <-> '.join(sorted(c))}")
        bad += 1
    for c in found:
        known = c in KNOWN
        print(f"cycles: {'known (issue #61)' if known else 'NEW'}: {' <-> '.join(sorted(c))}")
        bad += not known
    for k in KNOWN:
        if k not in found:
            print(f"cycles: no longer a circle as listed (update KNOWN): {' '.join(sorted(k))}")
            bad += 1
    print("cycles: ok" if not bad else f"cycles: {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
