# SPDX-License-Identifier: Apache-2.0
"""kvpool: a Python client of kvpoold, the remote vLLM KV-cache block pool.

    import kvpool
    with kvpool.Client("ipc:///tmp/kvpool.ipc", pool="default") as c:
        ids = c.allocate(4)
        c.free(ids)

Built on libkvpool.so through ctypes: nothing is compiled at install time.
kvpool.vllm has adapters shaped like vLLM's BlockPool and KVCacheManager.
"""
from .errors import (BY_STATUS, Busy, DeadlineExceeded, Internal, InvalidArgument, KvpoolError,
                     MessageTooLarge, NoDevice, NoMemory, NoSpace, NotFound, NotOwner,
                     NotSupported, OutOfRange, QuotaExceeded, Unauthenticated, Unavailable,
                     UnknownPool, UnsupportedVersion, WrongState)
from .client import Client, Hasher, SlotsResult
from .region import AdoptedRegion, Region, RegionRef, adopt_region, offload_key
from .batch import Batch, CallResult
from .events import (AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, Index, Reset,
                     Subscriber)
from . import _lib

__version__ = "0.2.0"
library_path = _lib.path

__all__ = ["Client", "Hasher", "SlotsResult", "Region", "RegionRef", "AdoptedRegion", "adopt_region", "offload_key", "Batch", "CallResult", "Subscriber", "Index",
           "EventBatch", "Reset", "BlockStored", "BlockRemoved", "AllBlocksCleared",
           "KvpoolError", "InvalidArgument", "NoSpace",
           "NotFound", "WrongState", "NotOwner", "UnknownPool", "UnsupportedVersion",
           "MessageTooLarge", "Unauthenticated", "Busy", "Internal", "OutOfRange", "NoMemory",
           "NotSupported", "NoDevice", "Unavailable", "QuotaExceeded", "DeadlineExceeded", "BY_STATUS", "library_path"]
