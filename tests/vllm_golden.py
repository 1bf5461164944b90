#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kvpool's vLLM-wire payloads against Python msgpack (Debian python3-msgpack)
packing the equivalent values, byte for byte: scenario F5's events with extra
keys ("L", ("img", -2)) on both blocks, dp rank 1, as maps (vLLM >= 0.26:
"type" first, None-default fields left out) and as arrays (every field), with
int and bytes hashes. Usage: vllm_golden.py PATH/TO/test_vllm_wire"""
import subprocess
import sys

import msgpack

H1 = bytes.fromhex("c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb")
H2 = bytes.fromhex("24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6")


def expected(form, hashes):
    h = (lambda x: int.from_bytes(x, "big") & (2**64 - 1)) if hashes == "int" else (lambda x: x)
    ek = ("L", ("img", -2))
    if form == "map":
        st = {"type": "BlockStored", "block_hashes": [h(H1), h(H2)], "parent_block_hash": None,
              "token_ids": list(range(1, 9)), "block_size": 4, "lora_id": None, "medium": "GPU",
              "lora_name": None, "extra_keys": [ek, ek], "group_idx": 0,
              "kv_cache_spec_kind": "full_attention"}
        rm = {"type": "BlockRemoved", "block_hashes": [h(H2)], "medium": "GPU", "group_idx": 0}
        cl = {"type": "AllBlocksCleared"}
    else:
        st = ["BlockStored", [h(H1), h(H2)], None, list(range(1, 9)), 4, None, "GPU", None,
              [ek, ek], 0, "full_attention", None]
        rm = ["BlockRemoved", [h(H2)], "GPU", 0]
        cl = ["AllBlocksCleared"]
    return msgpack.packb([1700000000.5, [st, rm, cl], 1], use_bin_type=True)


def main():
    out = subprocess.run([sys.argv[1], "--dump"], check=True, capture_output=True, text=True)
    failures = 0
    for line in out.stdout.split("\n"):
        if not line:
            continue
        name, got = line.split()
        form, hashes = name.split("-")
        want = expected(form, hashes).hex()
        ok = got == want
        failures += not ok
        print("%-12s %4d bytes %s" % (name, len(got) // 2, "ok" if ok else "DIFFERS"))
        if not ok:
            print("  got  " + got + "\n  want " + want)
    return 1 if failures or not out.stdout else 0


if __name__ == "__main__":
    sys.exit(main())
