# SPDX-License-Identifier: Apache-2.0
"""Machine-readable benchmark figures: with KVP_BENCH_JSON=FILE, each figure
is appended to FILE as one line of JSON, which tests/bench/report.py turns
into BENCHMARKS.md's tables. The C programs write the same lines
(bench_util.h, bench_json)."""
import json
import os


def record(area: str, row: str, value: float, unit: str, baseline: str,
           baseline_value: float, better: str) -> None:
    """One figure beside its same-run baseline; better is "higher" or "lower"."""
    path = os.environ.get("KVP_BENCH_JSON")
    if not path:
        return
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be higher or lower, not {better!r}")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"area": area, "row": row, "value": value, "unit": unit,
                            "baseline": baseline, "baseline_value": baseline_value,
                            "better": better}) + "\n")


def note(area: str, text: str) -> None:
    """A fact beside an area's figures that is no ratio (a count, a peak)."""
    path = os.environ.get("KVP_BENCH_JSON")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"area": area, "note": text}) + "\n")
