/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events.h: KV cache events (vLLM's BlockStored, BlockRemoved,
 * AllBlocksCleared; reference section 7) in one batch type that both sides
 * share: the engine fills it, the client's decoder fills it from the wire,
 * and applications read it only through kvp_event_batch_count/get and the
 * struct kvp_event view. Part of the shared layer (common/), not the engine.
 *
 * The pool appends events to its queue; kvp_pool_take_events() (or the
 * manager's) moves them into a caller-owned struct kvp_event_batch by
 * swapping buffers, so a caller that reuses one batch never allocates in
 * steady state. Events keep their emission order.
 *
 * Representation choices (each documented where vLLM differs in form):
 *  - hashes are full width (32·k bytes, the group id stripped);
 *    kvp_hash_event_id() gives vLLM's default 64-bit integer form;
 *  - extra keys are carried per stored block as the canonical CBOR item
 *    that entered the block's hash (0xf6 for None); a BlockStored with no
 *    stored block has none, which is vLLM's extra_keys = None.
 *
 * Not thread-safe; a batch is owned by one thread at a time. Never prints.
 */
#ifndef KVP_EVENTS_H
#define KVP_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kvp_event_type {
	KVP_EVENT_BLOCK_STORED = 1,
	KVP_EVENT_BLOCK_REMOVED = 2,
	KVP_EVENT_ALL_CLEARED = 3,
};

/*
 * The medium of the blocks a cluster tier's store holds, as a pool
 * announces them (ClusterFill; docs/cluster.md, "Events"). vLLM's wire
 * gives these events locality "REMOTE".
 */
#define KVP_MEDIUM_CLUSTER "CLUSTER"

/* A decoded view of one event; pointers are valid until the batch changes. */
struct kvp_event {
	enum kvp_event_type type;
	uint32_t num_hashes;        /* stored or removed blocks */
	uint32_t hash_len;          /* bytes per hash: 32·k */
	const uint8_t *hashes;      /* num_hashes × hash_len */
	const uint8_t *parent;      /* Stored: hash_len bytes, or NULL (None) */
	const int64_t *token_ids;   /* Stored: the whole [cached, full) range */
	uint32_t num_tokens;
	uint32_t block_size;        /* Stored: the group's block size */
	bool has_lora_id;
	int64_t lora_id;
	const char *lora_name;      /* NULL: None */
	const char *medium;         /* NULL: None; KVP_MEDIUM_CLUSTER: the cluster tier's */
	const char *session_id;     /* Stored: the request's session_id, NULL: None */
	const uint8_t *extra_keys;  /* Stored: num_hashes CBOR items, back to back */
	const uint32_t *extra_key_offsets; /* num_hashes + 1 offsets into extra_keys */
	bool has_group_idx;
	uint32_t group_idx;
	const char *spec_kind;      /* Stored: set by the manager, else NULL */
	bool has_sliding_window;
	int64_t sliding_window;
};

/* Storage; treat as opaque. */
struct kvp_event_rec;
struct kvp_event_batch {
	struct kvp_event_rec *recs;
	size_t count, rec_cap;
	uint8_t *data;
	size_t len, data_cap;
};

/* Initialises an empty batch (no allocation). */
void kvp_event_batch_init(struct kvp_event_batch *b);
/* Frees a batch's memory; safe on an initialised or zeroed batch. */
void kvp_event_batch_fini(struct kvp_event_batch *b);
/* Drops all events, keeping the memory for reuse. */
void kvp_event_batch_clear(struct kvp_event_batch *b);
/* Number of events. */
size_t kvp_event_batch_count(const struct kvp_event_batch *b);
/* Fills *ev with event i. KVP_EINVAL if i is out of range. */
int kvp_event_batch_get(const struct kvp_event_batch *b, size_t i, struct kvp_event *ev);
/* Sets the spec kind (a static string) and sliding window of Stored event i. */
int kvp_event_batch_set_spec(struct kvp_event_batch *b, size_t i, const char *kind,
                             bool has_window, int64_t window);

/* Swaps the contents of two batches (O(1)). */
void kvp_event_batch_swap(struct kvp_event_batch *a, struct kvp_event_batch *b);

/*
 * Engine-internal builders. Reserve first (may fail with KVP_ENOMEM), then
 * append: appends within a reservation cannot fail, so a pool operation
 * reserves before it mutates and never loses an event halfway.
 */
int kvp_event_batch_reserve(struct kvp_event_batch *b, size_t events, size_t bytes);
/* Worst-case bytes reserve() needs for a Removed event / a Stored event. */
size_t kvp_event_removed_bytes(size_t hash_len, const char *medium);
size_t kvp_event_stored_bytes(size_t num_hashes, size_t hash_len, bool parent,
                              size_t num_tokens, const char *lora_name,
                              const char *session_id, const char *medium,
                              size_t extra_bytes);

void kvp_event_append_removed(struct kvp_event_batch *b, const uint8_t *hash,
                              size_t hash_len, const char *medium, uint32_t group);
void kvp_event_append_cleared(struct kvp_event_batch *b);

/*
 * Starts a Stored event; the caller then adds each stored hash with
 * kvp_event_stored_add() and ends with kvp_event_stored_end().
 */
struct kvp_stored_desc {
	size_t hash_len;
	const uint8_t *parent;          /* NULL: None */
	const int64_t *token_ids;
	size_t num_tokens;
	uint32_t block_size;
	bool has_lora_id;
	int64_t lora_id;
	const char *lora_name;
	const char *session_id;         /* NULL or "": None */
	const char *medium;
	uint32_t group_idx;
	size_t max_hashes;              /* upper bound on stored_add calls */
};
void kvp_event_stored_begin(struct kvp_event_batch *b, const struct kvp_stored_desc *d);
void kvp_event_stored_add(struct kvp_event_batch *b, const uint8_t *hash,
                          const uint8_t *extra_cbor, size_t extra_len);
void kvp_event_stored_end(struct kvp_event_batch *b);

#endif /* KVP_EVENTS_H */
