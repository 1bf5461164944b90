/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fill.h: a region pool's cluster-fill table (docs/cluster.md). A lookup
 * that misses a key while the pool's cluster agent is alive asks the table:
 * the key becomes WANTED (the lookup answers "pending", -2) for the pool's
 * cluster_wait_ms; the agent takes wanted keys (ClusterFill), fills the
 * ones the cluster holds into rows (Reserve, Commit: later lookups hit
 * before asking here) and reports the rest ABSENT, which lookups then miss
 * for cluster_miss_ms. A key the agent never answers misses once its wait
 * is over, for cluster_miss_ms too, so a slow cluster costs each key one
 * wait, not one per lookup.
 *
 * Bounded: at most `cap` keys, found through a u64map by fingerprint; a
 * key that finds no room (every entry live) or shares a fingerprint with
 * another answers a miss and counts in `dropped`. Every call is O(1) but
 * take (O(keys taken)). Not thread-safe: the pool's lock guards it. No I/O.
 */
#ifndef KVPD_FILL_H
#define KVPD_FILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service/rpc/u64map.h"

/* How long after its last ClusterFill a pool's agent counts as alive. */
#define KVPD_FILL_AGENT_MS 2000u

struct kvpd_fill {
	size_t key_len;               /* 0: no table (the pool has no cluster tier) */
	uint32_t cap, wait_ms, miss_ms;
	uint64_t agent_seen_ms;       /* the last ClusterFill; 0: never */
	struct kvpd_fill_entry {
		uint64_t fp;          /* the key's fingerprint; 0: a free entry */
		uint64_t until_ms;    /* WANTED, TAKEN: pending until; ABSENT: missing until */
		uint32_t gen;         /* bumped on reuse: stale want-queue items are skipped */
		uint8_t state;
	} *e;
	uint8_t *keys;                /* entry i's key at i * key_len */
	struct kvpd_u64map index;     /* fingerprint -> entry + 1 */
	struct kvpd_fill_want {
		uint32_t entry, gen;
	} *q;                         /* wanted entries, oldest first: a ring of cap */
	uint32_t q_head, q_len, hand; /* hand: where the search for a free entry goes on */
	uint64_t pending, dropped;    /* lookups answered pending; keys that found no room */
};

enum kvpd_fill_answer { KVPD_FILL_MISS = 0, KVPD_FILL_PENDING = 1 };

/*
 * A table for keys of key_len bytes (1..128) with room for cap (1..2^20)
 * of them. KVP_OK, KVP_EINVAL or KVP_ENOMEM (f zeroed: no table).
 */
int kvpd_fill_init(struct kvpd_fill *f, size_t key_len, uint32_t cap, uint32_t wait_ms,
                   uint32_t miss_ms);
void kvpd_fill_fini(struct kvpd_fill *f);

/* Whether lookups ask the table now: it exists and its agent is alive. */
bool kvpd_fill_on(const struct kvpd_fill *f, uint64_t now_ms);

/* A lookup missed key: PENDING (the agent will fill it, or answer) or MISS. */
enum kvpd_fill_answer kvpd_fill_ask(struct kvpd_fill *f, const uint8_t *key, uint64_t now_ms);

/*
 * key was committed (filled, or stored by anyone): its entry goes, so that
 * a lookup after the row's next eviction asks afresh rather than missing
 * for miss_ms as a key the agent never answered would. Not there: nothing.
 */
void kvpd_fill_forget(struct kvpd_fill *f, const uint8_t *key);

/*
 * The agent's call: marks each of absent[0..n_absent) ABSENT, then moves
 * up to max wanted keys, oldest first, into out (max * key_len bytes) and
 * marks them TAKEN. Returns how many; *waiting: wanted keys left queued.
 */
size_t kvpd_fill_agent(struct kvpd_fill *f, const uint8_t *absent, size_t n_absent, uint8_t *out,
                       size_t max, uint32_t *waiting, uint64_t now_ms);

#endif
