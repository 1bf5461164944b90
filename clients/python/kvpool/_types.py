# SPDX-License-Identifier: Apache-2.0
"""The type aliases the package's hints use (PEP 484; `py.typed` marks the
package as typed, PEP 561)."""
from typing import Any, Hashable, Optional, Protocol, Sequence, Tuple, Union

#: Block ids, token ids, slots: any sequence of ints (list, tuple, range, array).
Ids = Sequence[int]
#: Block hashes: bytes of the pool's hash_len each (vLLM's BlockHash).
Hashes = Sequence[bytes]
#: Multimodal features: (identifier, offset, length) per item, sorted by offset.
MMFeatures = Optional[Sequence[Tuple[Union[str, bytes], int, int]]]
#: A C-contiguous buffer: bytes, bytearray, memoryview, a NumPy array, a CPU
#: torch tensor (Python 3.11 has no typing name for the buffer protocol).
Buffer = Any


class RequestLike(Protocol):
    """What the vLLM adapters read of a vLLM Request (any object with these;
    lora_request, cache_salt, mm_features, skip_reading_prefix_cache and
    num_preemptions are read when present)."""

    @property
    def request_id(self) -> Hashable: ...

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def block_hashes(self) -> Sequence[bytes]: ...

    @property
    def num_tokens(self) -> int: ...
