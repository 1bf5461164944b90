/* SPDX-License-Identifier: Apache-2.0 */
/*
 * big_alloc.h: zeroed allocations for large arrays (the engine's block
 * metadata, map buckets and keys). Large ones come from anonymous mappings
 * aligned to 2 MiB and marked for transparent huge pages where the system
 * offers them: the prefix map is probed at random, and with 4 KiB pages most
 * probes of a large pool also miss the TLB. Pages are still mapped lazily,
 * so creating a pool stays cheap. Small ones use calloc.
 *
 * Shared by the engine and the cpu executor. Thread-safe. No I/O.
 */
#ifndef KVP_BIG_ALLOC_H
#define KVP_BIG_ALLOC_H

#include <stddef.h>

/* Returns n zeroed bytes, or NULL. Free with kvp_big_free(p, n). */
void *kvp_big_alloc(size_t n);
/* Frees a kvp_big_alloc() block of n bytes; NULL is a no-op. */
void kvp_big_free(void *p, size_t n);

#endif /* KVP_BIG_ALLOC_H */
