# SPDX-License-Identifier: Apache-2.0
"""BENCHMARKS.md's generated tables, from the benchmark programs' own
machine-readable figures (KVP_BENCH_JSON: bench_json.py, bench_util.h).

    python3 tests/bench/report.py run [--quick] [--all | --only AREA,...] [--out FILE]
        runs each area's benchmark with KVP_BENCH_JSON set and writes every
        figure, with the command, date, machine and commit, to FILE
        (default build/bench-results.jsonl); fails if an area gave none.
        Without --only: every area but the long ones (the 10-minute soak)
        and those that need a GPU; --all adds the soak, and the GPU areas
        where nvidia-smi finds a device. --quick runs every area but the
        GPU's, each as a smoke run (CI)
    python3 tests/bench/report.py render [FILE] [--into DOC]
        replaces each area's table in BENCHMARKS.md, or DOC (between
        <!-- bench:AREA --> and <!-- /bench:AREA -->) with FILE's figures
        and notes; areas FILE does not hold keep theirs

Each row is a figure beside a baseline measured in the same run, and
kvpool's advantage over it (higher is better: value / baseline; lower is
better: baseline / value; below 1.0x kvpool is behind).
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = "$(sh tests/vllm/env.sh)/bin/python"
# area -> (title, command run from the repository root; {venv} is vLLM 0.33's Python).
# A command's --quick form appends --quick, but for those in QUICK.
AREAS = {
    "engine": ("The engine against vLLM 0.33's own BlockPool (Python), and the remote cycle",
               "{venv} tests/bench/bench_vllm_engine.py build"),
    "step": ("The scheduler step against vLLM 0.33's own KVCacheManager",
             "{venv} clients/python/bench/bench_vllm_step.py build"),
    "offload": ("vLLM's offloading tier: kvpool's spec against vLLM's own CPU tier",
                "{venv} clients/python/bench/bench_vllm_offload.py build"),
    "tier": ("kvpool as a secondary tier under vLLM's own tiering against vLLM's fs tier on "
             "tmpfs", "{venv} clients/python/bench/bench_vllm_tier.py build"),
    "python": ("The Python package against the C client",
               "/usr/bin/python3 clients/python/bench/bench_python.py build"),
    "service": ("The service's calls against raw nng", "./build/tests/bench/kvp-bench-service"),
    "s256": ("S256, the scheduler step over the wire, against the engine and a raw round trip",
             "./build/tests/bench/kvp-bench-step --pin 0,1"),
    "events": ("Event streams against raw PUB/SUB, and what vLLM's wire costs the RPC path",
               "./build/tests/bench/kvp-bench-events"),
    "region": ("The shared region against memcpy, and against WriteBlocks/ReadBlocks",
               "./build/tests/bench/kvp-bench-region"),
    "restart": ("restart=warm: a 4 GiB region's restart to ready against a raw CRC32C of its "
                "bytes and a cold start", "./build/tests/bench/kvp-bench-restart"),
    "disk": ("The disk tier's write behind and read back against raw O_DIRECT I/O of the same "
             "bytes", "./build/tests/bench/kvp-bench-disk"),
    "cluster": ("The cluster tier's fill between two namespaces against Mooncake Store's own get, "
                "a raw TCP stream and ReadBlocks over tcp (root)",
                "KVP_MOONCAKE_VENV=$(sh tests/cluster/env.sh) "
                "python3 clients/python/bench/bench_cluster.py build"),
    "executor": ("The executor (cpu backend) and the data plane's calls against memcpy and raw "
                 "nng", "./build/tests/bench/kvp-bench-executor"),
    "floors": ("The batched cycle against what nng leaves a daemon (placed: clients on one CPU, "
               "the server on the other)",
               "./build/tests/bench/kvp-bench-service --only-batch=8 --pin 0,1"),
    "samehost": ("A same-host call against a raw futex ping-pong of its bytes, and nng ipc",
                 "./build/tests/bench/kvp-bench-samehost"),
    "fair": ("An honest client's lookups beside 50 busy peers (issue #60 item 9)",
             "./build/tests/bench/kvp-bench-fair"),
    "soak": ("Honest clients beside hostile peers: the hostile soak",
             "./build/tests/kvp-soak-hostile --seconds 600"),
    "gpu": ("The executor (cuda backend) and vLLM's offloading copies on a GPU",
            "./build-gpu/tests/bench/kvp-bench-executor --gpu && "
            "python3 clients/python/bench/bench_kv_copy.py --device cuda build-gpu"),
}
LONG = {"soak"}
GPU = {"gpu"}
PINNED = {"s256", "floors"}
QUICK = {"soak": "./build/tests/kvp-soak-hostile --seconds 10 --quick"}


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


def chosen(args):
    if args.only:
        return args.only.split(",")
    if args.quick:
        return [a for a in AREAS if a not in GPU]
    skip = set() if args.all else set(LONG)
    if not (args.all and have_gpu()):
        skip |= GPU
    return [a for a in AREAS if a not in skip]


def runnable(area):
    """Why an area cannot run on this machine, or None."""
    if area in PINNED and (os.cpu_count() or 1) < 2:
        return "needs two CPUs (--pin 0,1)"
    return None


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = re.sub(r"\s+", " ", line.split(":", 1)[1].strip())
                    break
    except OSError:
        pass
    gpus = ""
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True)
        names = [ln.split(",")[0].strip() for ln in q.stdout.splitlines() if ln.strip()]
        drivers = {ln.split(",")[-1].strip() for ln in q.stdout.splitlines() if "," in ln}
        if q.returncode == 0 and names:
            gpus = f", {len(names)} x {names[0]} (driver {', '.join(sorted(drivers))})"
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs{gpus}"


def commit():
    if os.environ.get("KVP_BENCH_COMMIT"):  # a copy of the tree whose .git is not its own
        return os.environ["KVP_BENCH_COMMIT"]
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    c = git("rev-parse", "--short=7", "HEAD").strip() or "unknown"
    changed = [ln for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
               if not ln.endswith(" BENCHMARKS.md")]  # the output itself
    return c + ("+changes" if changed else "")


def run(args):
    areas = chosen(args)
    venv = ""  # only areas that run vLLM need its environment (a GPU machine has none)
    if any("{venv}" in AREAS[a][1] for a in areas if a in AREAS):
        venv = subprocess.run(["sh", "tests/vllm/env.sh"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "machine": machine(), "commit": commit(), "quick": args.quick}
    out, bad = [], []
    for area in areas:
        if area not in AREAS:
            sys.exit(f"report: no area {area!r} (areas: {', '.join(AREAS)})")
        if runnable(area):
            print(f"report: {area}: skipped: {runnable(area)}", file=sys.stderr)
            continue
        base = AREAS[area][1]
        if args.quick:
            base = QUICK.get(area, base + " --quick")
        shown = base.format(venv=VENV)
        cmd = base.format(venv=os.path.join(venv, "bin", "python") if venv else "false")
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as tmp:
            print(f"report: {area}: {shown}", file=sys.stderr, flush=True)
            r = subprocess.run(cmd, shell=True, cwd=ROOT,
                               env={**os.environ, "KVP_BENCH_JSON": tmp.name})
            figures = [json.loads(line) for line in tmp if line.strip()]
        mine = [f for f in figures if f.get("area") == area and "value" in f]
        notes = [f for f in figures if f.get("area") == area and "note" in f]
        if r.returncode != 0 or not mine:
            bad.append(f"{area} (exit {r.returncode}, {len(mine)} figures)")
        out += [{**f, **meta, "command": shown} for f in mine + notes]
    path = args.out or os.path.join(ROOT, "build", "bench-results.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(x) + "\n" for x in out)
    print(f"report: {len(out)} figures in {path}", file=sys.stderr)
    if bad:
        sys.exit("report: no figures from " + "; ".join(bad))


SI = [(1e9, "G"), (1e6, "M"), (1e3, "k")]


def fmt(v, unit):
    if unit.endswith("/s") and v >= 1e3:
        for scale, p in SI:
            if v >= scale:  # GB/s, but M blocks/s
                x = v / scale
                x_s = f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
                return f"{x_s} {p}{'' if unit.startswith('B/') else ' '}{unit}"
    return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"


def table(area, items):
    figs = [x for x in items if "value" in x]
    notes = [x["note"] for x in items if "note" in x]
    f0 = figs[0]
    quick = " (`--quick`: a smoke run, not a measurement)" if f0.get("quick") else ""
    lines = [f"<!-- bench:{area} -->",
             f"### {AREAS.get(area, (area,))[0]}", "",
             "```sh", f0["command"], "```", "",
             f"{f0['date']}, {f0['machine']}, commit `{f0['commit']}`{quick}. Generated by "
             "`tests/bench/report.py` from the program's own figures.", "",
             "| figure | kvpool | baseline, measured in the same run | the baseline's | "
             "kvpool's advantage |",
             "|---|---|---|---|---|"]
    for f in figs:
        v, b = f["value"], f["baseline_value"]
        adv = (v / b if f["better"] == "higher" else b / v) if v > 0 and b > 0 else 0
        lines.append(f"| {f['row']} | {fmt(v, f['unit'])} | {f['baseline']} | "
                     f"{fmt(b, f['unit'])} | {adv:.2f}x |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines.append(f"<!-- /bench:{area} -->")
    return "\n".join(lines)


def render(args):
    path = args.file or os.path.join(ROOT, "build", "bench-results.jsonl")
    with open(path, encoding="utf-8") as f:
        figs = [json.loads(line) for line in f if line.strip()]
    doc_path = args.into or os.path.join(ROOT, "BENCHMARKS.md")
    with open(doc_path, encoding="utf-8") as f:
        doc = f.read()
    done = []
    for area in dict.fromkeys(x["area"] for x in figs):
        block = table(area, [x for x in figs if x["area"] == area])
        pat = re.compile(rf"<!-- bench:{re.escape(area)} -->.*?<!-- /bench:{re.escape(area)} -->",
                         re.S)
        if not pat.search(doc):
            sys.exit(f"report: {doc_path} has no <!-- bench:{area} --> block to replace")
        doc = pat.sub(lambda _: block, doc)
        done.append(area)
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(doc)
    print(f"report: {doc_path}: {', '.join(done)} regenerated", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--only")
    r.add_argument("--all", action="store_true")
    r.add_argument("--out")
    g = sub.add_parser("render")
    g.add_argument("file", nargs="?")
    g.add_argument("--into")
    a = ap.parse_args()
    run(a) if a.cmd == "run" else render(a)


if __name__ == "__main__":
    main()
