# SPDX-License-Identifier: Apache-2.0
"""The docs hold to what they show (issue #50). Usage:
    check_docs.py ROOT KVPOOLD [CC]

- Every relative link in README.md, BENCHMARKS.md, docs/ and the folder
  READMEs names a file that exists, and its #anchor a heading of that page
  (GitHub's slugs).
- Every fenced block in README.md and docs/ says its language.
- `sh` blocks of kvpoold command lines run here, each with --check-config
  (ipc:///run/kvpool/ moved to a scratch directory): the daemon accepts them.
- `conf` blocks (kvpoold's configuration file) pass `kvpoold --config FILE
  --check-config`.
- `c` blocks without main() compile against the tree's headers.
- Every other command or program block (sh, c with main, python) is run by
  the test CLAIMS names, which must exist and name the page; a new block
  fails here until a test runs it.
- `text` blocks (output, diagrams) are free.
- docs/operations.md's metrics table names every series a running kvpoold
  exports, and no other.
"""
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

# (page, the block's first line, starting with) -> the test that runs it.
CLAIMS = [
    ("README.md", "sh tests/deps.sh && cmake", ".ci/run"),
    ("README.md", "#include <stdio.h>", "tests/check_install.sh"),
    ("README.md", "import kvpool", "clients/python/tests/test_docs.py"),
    ("README.md", "vllm serve", "clients/python/tests/vllm033/test_docs_vllm.py"),
    ("docs/getting-started.md", "sh tests/deps.sh && cmake", ".ci/run"),
    ("docs/getting-started.md", "cmake -S . -B build", "tests/check_debian.sh"),
    ("docs/getting-started.md", "cc app.c", "tests/check_install.sh"),
    ("docs/python.md", "import numpy as np", "clients/python/tests/test_docs.py"),
    ("docs/vllm.md", "vllm serve", "clients/python/tests/vllm033/test_docs_vllm.py"),
    ("docs/cluster.md", "pip install mooncake", "clients/python/tests/vllm033/cluster_net.py"),
    ("docs/cluster.md", "python -m kvpool.cluster", "clients/python/tests/test_docs.py"),
    ("docs/cluster.md", "helm install kvpool", "deploy/check/run.sh"),
]
FENCE = re.compile(r"^( *)```(.*)$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """The #anchors of a Markdown page's headings, as GitHub makes them."""
    out, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line.rstrip("\n")):
                fenced = not fenced
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def blocks(path):
    """(line number, language, lines) of each fenced block."""
    out, cur = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip("\n"))
            if m and cur is None:
                cur = (n, m.group(2).strip().split(" ")[0], len(m.group(1)), [])
            elif m and cur is not None:
                out.append((cur[0], cur[1], cur[3]))
                cur = None
            elif cur is not None:
                cur[3].append(line.rstrip("\n")[cur[2]:])
    if cur is not None:
        out.append((cur[0], "(unclosed)", cur[3]))
    return out


def commands(lines):
    """The block's commands: continuation lines and open quotes joined,
    comments dropped."""
    out, acc = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            acc += line.rstrip()[:-1] + " "
            continue
        acc += line
        try:
            words = shlex.split(acc, comments=True)
        except ValueError:  # a quote spans lines
            acc += "\n"
            continue
        if words:
            out.append(words)
        acc = ""
    return out


def sh_commands(path, first):
    """The commands (words) of path's sh blocks whose first line starts with
    first: for the tests CLAIMS names, which run a page's commands."""
    return [c for _, lang, body in blocks(path)
            if lang == "sh" and body and body[0].startswith(first) for c in commands(body)]


def check_config(kvpoold, tmp, args):
    """kvpoold --check-config on args (ipc:///run/kvpool/ moved to tmp): its
    complaint, or None when it accepts them."""
    args = [a.replace("ipc:///run/kvpool/", f"ipc://{tmp}/") for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    r = subprocess.run([kvpoold, *args, "--check-config"], env=env,
                       capture_output=True, text=True, timeout=60)
    return None if r.returncode == 0 else r.stdout + r.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_problems(root, kvpoold, tmp, counts):
    """The series a kvpoold exports (with the vLLM wire on, which adds its
    own) against those docs/operations.md's table names."""
    admin, vllm = free_port(), free_port()
    proc = subprocess.Popen([kvpoold, "--quiet", "--rpc", f"ipc://{tmp}/m.ipc", "--events",
                             "none", "--admin", f"http://127.0.0.1:{admin}", "--vllm-events",
                             f"tcp://127.0.0.1:{vllm}", "--pool", "name=m,blocks=16"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    body = None
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=20)[1]
    if body is None:
        return [f"kvpoold gave no /metrics to check docs/operations.md against:\n{err}"]
    exported = set(re.findall(r"^# TYPE ((?:kvpool|process)_[a-z_]+)", body, re.M))
    counts["metrics"] = len(exported)
    with open(os.path.join(root, "docs", "operations.md"), encoding="utf-8") as f:
        rows = [ln for ln in f if ln.startswith("| `")]
    documented = set(re.findall(r"`((?:kvpool|process)_[a-z_]+)", "".join(rows)))
    out = [f"docs/operations.md: the metrics table lacks {m}, which kvpoold exports"
           for m in sorted(exported - documented)]
    out += [f"docs/operations.md: the metrics table names {m}, which kvpoold does not export"
            for m in sorted(documented - exported)]
    return out


def main():
    root, kvpoold = sys.argv[1], sys.argv[2]
    cc = sys.argv[3] if len(sys.argv) > 3 else "cc"
    problems, counts = [], {"links": 0, "run": 0, "compiled": 0, "claimed": 0, "metrics": 0}
    pages = ["README.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    linked = pages + ["BENCHMARKS.md"]
    for d, subdirs, files in os.walk(root):  # every folder's README
        subdirs[:] = sorted(x for x in subdirs if not x.startswith(("build", ".")) and
                            x not in ("node_modules", "out", "docs"))
        if "README.md" in files and d != root:
            linked.append(os.path.relpath(os.path.join(d, "README.md"), root))
    for page in linked:
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = f.read()
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            counts["links"] += 1
            name, _, anchor = target.partition("#")
            where = os.path.normpath(os.path.join(root, os.path.dirname(page), name)) if name \
                else os.path.join(root, page)
            if not os.path.exists(where):
                problems.append(f"{page}: the link to {target} names no file")
            elif anchor and where.endswith(".md") and anchor not in anchors(where):
                problems.append(f"{page}: the link to {target} names no heading of "
                                f"{os.path.relpath(where, root)}")
    used = set()
    with tempfile.TemporaryDirectory() as tmp:
        for page in pages:
            for line, lang, body in blocks(os.path.join(root, page)):
                where = f"{page}:{line}"
                first = next((b.strip() for b in body if b.strip()), "")
                if lang == "":
                    problems.append(f"{where}: a block without a language (text, sh, conf, c, "
                                    "python)")
                    continue
                if lang == "text":
                    continue
                cmds = commands(body) if lang == "sh" else []
                if cmds and all(c[0] == "kvpoold" for c in cmds):
                    for c in cmds:
                        counts["run"] += 1
                        why = check_config(kvpoold, tmp, c[1:])
                        if why:
                            problems.append(f"{where}: kvpoold refuses `{shlex.join(c)}`:\n{why}")
                    continue
                if lang == "conf":
                    conf = os.path.join(tmp, "block.conf")
                    with open(conf, "w") as f:
                        f.write("\n".join(b.replace("ipc:///run/kvpool/", f"ipc://{tmp}/")
                                          for b in body) + "\n")
                    counts["run"] += 1
                    why = check_config(kvpoold, tmp, ["--config", conf])
                    if why:
                        problems.append(f"{where}: kvpoold refuses this configuration file:\n{why}")
                    continue
                if lang == "c" and not re.search(r"\bmain\s*\(", "\n".join(body)):
                    src = os.path.join(tmp, "block.c")
                    with open(src, "w") as f:
                        f.write("\n".join(body) + "\n")
                    r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-c",
                                        "-I", root, "-o", os.path.join(tmp, "block.o"), src],
                                       capture_output=True, text=True)
                    counts["compiled"] += 1
                    if r.returncode != 0:
                        problems.append(f"{where}: the C block does not compile:\n{r.stderr}")
                    continue
                claim = next((c for c in CLAIMS if c[0] == page and first.startswith(c[1])), None)
                if claim is None:
                    problems.append(f"{where}: a {lang} block no test runs (`{first[:60]}`): "
                                    "run it from a test and name that test in CLAIMS")
                    continue
                used.add(claim)
                test = os.path.join(root, claim[2])
                counts["claimed"] += 1
                if not os.path.isfile(test):
                    problems.append(f"{where}: {claim[2]}, which runs it, does not exist")
                elif page not in open(test, encoding="utf-8").read():
                    problems.append(f"{where}: {claim[2]} does not name {page}")
    for c in CLAIMS:
        if c not in used:
            problems.append(f"CLAIMS names a block {c[0]} no longer has: `{c[1]}`")
    with tempfile.TemporaryDirectory() as tmp:
        problems += metrics_problems(root, kvpoold, tmp, counts)
    for p in problems:
        print(f"check_docs: {p}", file=sys.stderr)
    print(f"check_docs: {len(pages)} pages; {counts['links']} links; {counts['run']} kvpoold "
          f"lines checked, {counts['compiled']} C blocks compiled, {counts['claimed']} blocks "
          f"run by the tests that claim them; {counts['metrics']} metric series in operations.md; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
