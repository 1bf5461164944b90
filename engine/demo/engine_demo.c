/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-engine-demo: a scheduler's view of the kvpool engine, in one process.
 *
 * Requests that share a system prompt arrive at a small pool (block size 4).
 * Each step prints the prefix hit, the blocks the request got, the events the
 * pool emitted and the pool's usage; later requests find the shared prefix
 * cached, and once the pool fills, allocation evicts the oldest cached blocks
 * (BlockRemoved) or, when nothing is free, the scheduler must preempt.
 *
 * This program prints; the engine library it drives does not.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "engine/manager.h"
#include "engine/pool.h"

#define BS 4
#define NUM_BLOCKS 20

static struct kvp_pool *pool;
static struct kvp_mgr *mgr;
static struct kvp_event_batch events;

/* Reports a failed call and hands its status back for the caller to return. */
static int
fail(const char *what, int rv)
{
	fprintf(stderr, "demo: %s: %s (%s)\n", what, kvp_strerror(rv), kvp_status_name(rv));
	return rv;
}

static void
print_ids(const char *label, const int32_t *ids, size_t n)
{
	printf("%s[", label);
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	printf("]");
}

/* Prints what the pool emitted since the last call, vLLM's event fields. */
static int
print_events(void)
{
	int rv = kvp_mgr_take_events(mgr, &events);
	if (rv != KVP_OK)
		return fail("take events", rv);
	for (size_t i = 0; i < kvp_event_batch_count(&events); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(&events, i, &ev);
		switch (ev.type) {
		case KVP_EVENT_BLOCK_STORED:
			printf("    event BlockStored  %u block(s), tokens %u, parent %s", ev.num_hashes,
			       ev.num_tokens, ev.parent ? "" : "None");
			if (ev.parent)
				printf("%016" PRIx64, kvp_hash_event_id(ev.parent, ev.hash_len));
			printf(", hashes");
			for (uint32_t h = 0; h < ev.num_hashes; h++)
				printf(" %016" PRIx64,
				       kvp_hash_event_id(ev.hashes + (size_t)h * ev.hash_len, ev.hash_len));
			printf("\n");
			break;
		case KVP_EVENT_BLOCK_REMOVED:
			printf("    event BlockRemoved %016" PRIx64 " (evicted to make room)\n",
			       kvp_hash_event_id(ev.hashes, ev.hash_len));
			break;
		case KVP_EVENT_ALL_CLEARED:
			printf("    event AllBlocksCleared\n");
			break;
		}
	}
	return KVP_OK;
}

static void
print_pool(void)
{
	printf("    pool: %u of %u blocks free (%u holding cached prefixes), usage %.0f%%\n",
	       kvp_pool_num_free(pool), kvp_pool_num_blocks(pool) - 1,
	       kvp_pool_num_cached_blocks(pool), kvp_pool_usage(pool) * 100.0);
}

/* A request: the shared system prompt, then its own user tokens. */
static int
arrive(uint64_t id, int user_tokens)
{
	int64_t tok[64];
	int n = 0;
	for (int i = 0; i < 12; i++)
		tok[n++] = 1000 + i; /* "You are a helpful assistant..." */
	for (int i = 0; i < user_tokens; i++)
		tok[n++] = (int64_t)(id * 100 + (uint64_t)i);
	struct kvp_request_desc d = {.prompt = tok, .num_prompt = (size_t)n};
	int rv = kvp_mgr_add_request(mgr, id, &d);
	if (rv != KVP_OK)
		return fail("add request", rv);

	int32_t hits[16], fresh[16];
	int32_t *const hit_out[] = {hits};
	int32_t *const fresh_out[] = {fresh};
	const int32_t *const hit_in[] = {hits};
	uint32_t hit = 0;
	size_t count = 0;
	if ((rv = kvp_mgr_get_computed_blocks(mgr, id, hit_out, 16, &hit)) != KVP_OK)
		return fail("lookup", rv);
	printf("request %" PRIu64 " arrives: %d prompt tokens, prefix hit %u tokens ", id, n, hit);
	print_ids("", hits, hit / BS);
	printf("\n");
	struct kvp_alloc_args a = {.num_new_tokens = (uint32_t)n - hit,
	                           .num_new_computed_tokens = hit,
	                           .computed_blocks = hit ? hit_in : NULL};
	rv = kvp_mgr_allocate_slots(mgr, id, &a, fresh_out, 16, &count);
	if (rv == KVP_ENOSPACE) {
		printf("    no room: the scheduler must preempt or wait (nothing changed)\n");
		kvp_mgr_free_request(mgr, id);
		print_pool();
		return KVP_OK;
	}
	if (rv != KVP_OK)
		return fail("allocate", rv);
	const int32_t *all;
	size_t nall;
	(void)kvp_mgr_request_blocks(mgr, id, 0, &all, &nall);
	print_ids("    allocated ", fresh, count);
	print_ids(", block table ", all, nall);
	printf("\n");
	if ((rv = print_events()) != KVP_OK)
		return rv;
	print_pool();
	return KVP_OK;
}

static int
decode(uint64_t id, int steps)
{
	for (int s = 0; s < steps; s++) {
		int64_t t = (int64_t)(id * 100 + 50 + (uint64_t)s);
		int32_t fresh[4];
		int32_t *const out[] = {fresh};
		size_t count = 0;
		struct kvp_alloc_args a = {.num_new_tokens = 1};
		int rv = kvp_mgr_append_tokens(mgr, id, &t, 1);
		if (rv == KVP_OK)
			rv = kvp_mgr_allocate_slots(mgr, id, &a, out, 4, &count);
		if (rv != KVP_OK)
			return fail("decode", rv);
	}
	printf("request %" PRIu64 " decodes %d tokens\n", id, steps);
	return print_events();
}

static int
finish(uint64_t id)
{
	int rv = kvp_mgr_free_request(mgr, id);
	if (rv != KVP_OK)
		return fail("free", rv);
	printf("request %" PRIu64 " finishes: its blocks go back to the free queue, still cached\n",
	       id);
	print_pool();
	return KVP_OK;
}

int
main(void)
{
	struct kvp_hasher *hasher = NULL;
	struct kvp_pool_config pc = {.num_blocks = NUM_BLOCKS, .hash_block_size = BS,
	                             .enable_caching = true, .enable_events = true,
	                             .medium = "CPU"};
	const uint32_t bs[] = {BS};
	struct kvp_mgr_config mc = {.num_groups = 1, .block_sizes = bs, .max_model_len = 64};
	int rv;

	kvp_event_batch_init(&events);
	if ((rv = kvp_hasher_create("0", &hasher)) != KVP_OK ||
	    (rv = kvp_pool_create(&pc, &pool)) != KVP_OK ||
	    (rv = kvp_mgr_create(pool, hasher, &mc, &mgr)) != KVP_OK) {
		fail("setup", rv);
		goto out;
	}

	printf("kvpool engine demo: %d blocks of %d tokens (block 0 is the null block), "
	       "sha256_cbor with seed \"0\"\n\n", NUM_BLOCKS, BS);
	if ((rv = arrive(1, 6)) || (rv = decode(1, 4)) || (rv = arrive(2, 9)) || (rv = finish(1)) ||
	    (rv = arrive(3, 5)) || (rv = arrive(4, 20)) || (rv = finish(2)) || (rv = finish(3)) ||
	    (rv = arrive(5, 30)) || (rv = arrive(6, 40)))
		goto out;

	struct kvp_mgr_stats st;
	kvp_mgr_get_stats(mgr, &st);
	printf("\nprefix cache: %" PRIu64 " queries, %" PRIu64 " of %" PRIu64
	       " prompt tokens hit (%.0f%%), %" PRIu64 " allocation(s) refused\n",
	       st.requests, st.hits, st.queries,
	       st.queries ? 100.0 * (double)st.hits / (double)st.queries : 0.0, st.alloc_failures);
	char detail[128];
	rv = kvp_pool_check(pool, detail, sizeof(detail));
	printf("invariants: %s\n", rv == KVP_OK ? "ok" : detail);
out:
	kvp_mgr_destroy(mgr);
	kvp_pool_destroy(pool);
	kvp_hasher_destroy(hasher);
	kvp_event_batch_fini(&events);
	return rv == KVP_OK ? 0 : 1;
}
