/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mgr_request.h: the manager's per-request record and its table (internal
 * to engine/manager.c). A record owns the request's tokens, fine hashes,
 * copies of its extra-key sources and one block table per KV cache group.
 * The table maps request ids to records: open addressing on the id,
 * backward-shift deletion, sized once for a maximum count.
 *
 * Not thread-safe; no I/O. The table never frees records: the manager
 * releases a record's blocks first, then destroys it.
 */
#ifndef KVP_MGR_REQUEST_H
#define KVP_MGR_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"
#include "engine/group_mgr.h"
#include "engine/manager.h"

struct kvp_mreq {
	uint64_t id;
	int64_t *tokens;
	size_t num_tokens, tok_cap;
	uint8_t *hashes;       /* fine hashes, one digest each */
	size_t num_hashes, hash_cap;
	size_t num_computed;
	size_t num_prompt;     /* vLLM's num_prompt_tokens: the tokens it was added with */
	uint32_t num_preemptions;
	bool skip_reading;
	bool has_lora_id;
	int64_t lora_id;
	/* Owned copies of the extra-key sources; keys points into them. */
	struct kvp_request_keys keys;
	bool has_keys;
	char *strings;         /* lora name, salt and mm identifiers, back to back */
	struct kvp_mm_feature *mm;
	struct kvp_grp_blocks groups[KVP_MGR_MAX_GROUPS];
};

/*
 * A record for request id with copies of keys (validated by the caller;
 * NULL: none), empty block tables and no tokens. KVP_ENOMEM; *out only on
 * success.
 */
int kvp_mreq_create(uint64_t id, const struct kvp_request_keys *keys, struct kvp_mreq **out);
/* Frees a record and what it owns (not its blocks' references). NULL: no-op. */
void kvp_mreq_destroy(struct kvp_mreq *r);
/* The request's extra keys, or NULL when it has none. */
const struct kvp_request_keys *kvp_mreq_keys(const struct kvp_mreq *r);

struct kvp_mreq_table {
	struct kvp_mreq **slots;
	uint32_t mask;
	uint32_t count;
};

/* A table for up to max records (1..2^30). KVP_EINVAL or KVP_ENOMEM. */
int kvp_mreq_table_init(struct kvp_mreq_table *t, uint32_t max);
/* Frees the slots (the records are the caller's). */
void kvp_mreq_table_fini(struct kvp_mreq_table *t);

/* The table's slot hash of a request id (a 64-bit finalizer). */
static inline uint32_t
kvp_mreq_id_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (uint32_t)x;
}

/* The record of id, or NULL (inline: every manager call starts here). */
static inline struct kvp_mreq *
kvp_mreq_table_find(const struct kvp_mreq_table *m, uint64_t id)
{
	for (uint32_t i = kvp_mreq_id_hash(id) & m->mask;; i = (i + 1) & m->mask) {
		struct kvp_mreq *r = m->slots[i];
		if (r == NULL || r->id == id)
			return r;
	}
}

/* Adds r; its id must be absent and the table below its maximum. */
void kvp_mreq_table_insert(struct kvp_mreq_table *t, struct kvp_mreq *r);
/* Removes id, which must be present. */
void kvp_mreq_table_remove(struct kvp_mreq_table *t, uint64_t id);

#endif /* KVP_MGR_REQUEST_H */
