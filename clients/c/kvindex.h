/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvindex.h: a reference index over a pool's event stream: (hash, group) ->
 * how many blocks cache it. What a KV-aware router keeps per pool to score
 * "how long a prefix of this request does that pool hold". Feed it a
 * subscriber's resets and batches.
 *
 * Not thread-safe. Never prints.
 */
#ifndef KVPOOL_KVINDEX_H
#define KVPOOL_KVINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/events.h"
#include "clients/c/kvpool.h"

struct kvp_index;

int kvp_index_create(struct kvp_index **out);
void kvp_index_destroy(struct kvp_index *ix);

/* Replaces the contents with a snapshot. KVP_OK or KVP_ENOMEM. */
int kvp_index_reset(struct kvp_index *ix, const struct kvp_snapshot_entry *e, size_t n);
/*
 * Applies a batch: BlockStored adds one block per hash, BlockRemoved takes
 * one away, AllBlocksCleared empties. KVP_OK, KVP_ENOMEM, or KVP_ESTATE if a
 * BlockRemoved names a (hash, group) with no block (the index had diverged;
 * the rest of the batch is still applied).
 */
int kvp_index_apply(struct kvp_index *ix, const struct kvp_event_batch *b);

/* Blocks caching (hash, group); 0 if none. */
uint32_t kvp_index_count(const struct kvp_index *ix, const uint8_t *hash, size_t len,
                         uint32_t group);
/* Distinct (hash, group) entries. */
size_t kvp_index_size(const struct kvp_index *ix);
/* How many leading hashes of a chain (n hashes of len bytes) the index holds in group. */
size_t kvp_index_prefix(const struct kvp_index *ix, const uint8_t *hashes, size_t n, size_t len,
                        uint32_t group);
/* True if the index holds exactly the snapshot's entries and counts. */
bool kvp_index_equals(const struct kvp_index *ix, const struct kvp_snapshot_entry *e, size_t n);

#endif /* KVPOOL_KVINDEX_H */
