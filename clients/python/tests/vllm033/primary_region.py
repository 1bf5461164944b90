# SPDX-License-Identifier: Apache-2.0
"""A stand-in for vLLM's SharedOffloadRegion, the memory of its CPU primary
tier, as CPUPrimaryTierOffloadingManager reads it: chunks of row_bytes in
one numpy array (kv), for test_vllm_tier.py and bench_vllm_tier.py."""
import numpy as np


class PrimaryRegion:
    def __init__(self, chunks, row_bytes):
        self.kv = np.zeros((chunks, row_bytes), dtype=np.uint8)

    def create_kv_memoryview(self):
        return memoryview(self.kv)

    def cleanup(self):
        pass
