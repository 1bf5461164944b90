/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpool-demo: a scheduler's session with kvpoold, for a newcomer to watch.
 *
 * Chat requests that share a system prompt are scheduled through the
 * request-level calls (AllocateSlots, FreeRequest): the first computes the
 * prompt, the others find it cached. Then a burst of long requests fills the
 * pool until the daemon answers NO_SPACE and the scheduler preempts, and
 * finished requests' blocks stay cached until allocation evicts them. In
 * between, when the pool has an executor, a prefill peer writes a prompt's
 * KV into its blocks and a decode peer finds the prefix and reads the same
 * bytes back, checksums verified.
 *
 * On a hybrid pool (several KV cache groups, such as gpt-oss's full and
 * sliding-window layers) it tells that story instead: a long decode in
 * which the window group frees the blocks that leave its window while
 * full attention keeps all, and a second request that hits both groups.
 *
 * usage: kvpool-demo [URL] [POOL]   (defaults: ipc:///tmp/kvpool.ipc default)
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/kvpool.h"
#include "proto/wire.h"

static struct kvp_client *c;

/* Reports a failed call; returns its status for the caller to return. */
static int
check(int rv, const char *what)
{
	if (rv != KVP_OK)
		fprintf(stderr, "kvpool-demo: %s: %s (%s): %s\n", what, kvp_strerror(rv),
		        kvp_status_name(rv), kvp_client_last_detail(c));
	return rv;
}

static int
show_stats(void)
{
	struct kvp_client_stats s;
	int rv;
	if ((rv = check(kvp_client_stats(c, &s), "stats")) != KVP_OK)
		return rv;
	printf("    pool: %u of %u blocks free, %u hold cached prefixes, usage %.1f%%; "
	       "prefix cache hit %" PRIu64 " of %" PRIu64 " prompt tokens; %" PRIu64 " evicted\n",
	       s.num_free, s.num_blocks - 1, s.num_cached_blocks, s.usage * 100.0, s.prefix_hits,
	       s.prefix_queries, s.blocks_evicted);
	return KVP_OK;
}

/* A chat request: the shared system prompt, then its own message. */
static int
chat(uint64_t id, int user_tokens, int decode_steps)
{
	int64_t prompt[256];
	int n = 0, rv;
	int32_t blocks[64];
	struct kvp_client_slots_result res;

	for (int i = 0; i < 48; i++)
		prompt[n++] = 1000 + i;
	for (int i = 0; i < user_tokens; i++)
		prompt[n++] = (int64_t)(id * 1000 + (uint64_t)i);
	struct kvp_client_slots a = {.request_id = id, .prompt = prompt, .num_prompt = (size_t)n,
	                             .use_prefix_cache = true};
	if ((rv = check(kvp_client_allocate_slots(c, &a, blocks, 64, &res), "allocate_slots")))
		return rv;
	printf("request %" PRIu64 ": %d prompt tokens, %u found cached, %u computed now, %zu new "
	       "block(s)\n", id, n, res.hit_tokens, res.num_scheduled_tokens, res.num_new_blocks);
	for (int s = 0; s < decode_steps; s++) {
		int64_t t = 7000 + s;
		struct kvp_client_slots d = {.request_id = id, .new_tokens = &t,
		                             .num_new_token_ids = 1, .num_new_tokens = 1};
		if ((rv = check(kvp_client_allocate_slots(c, &d, blocks, 64, &res), "decode")))
			return rv;
	}
	if (decode_steps > 0)
		printf("    decoded %d tokens (%u computed in all)\n", decode_steps,
		       res.num_computed_tokens);
	return KVP_OK;
}

/* Long prompts until the daemon answers NO_SPACE; then preempt one and retry. */
static int
burst(const struct kvp_client_info *in)
{
	uint32_t len = in->max_model_len < 4096 ? in->max_model_len : 4096;
	size_t cap = len / in->block_size + 2;
	int64_t *prompt = malloc(len * sizeof(*prompt));
	int32_t *blocks = malloc(cap * sizeof(*blocks));
	uint64_t id = 100, first = 100;
	int rv = prompt && blocks ? KVP_OK : KVP_ENOMEM;

	for (; rv == KVP_OK; id++) {
		struct kvp_client_slots_result res;
		for (uint32_t i = 0; i < len; i++)
			prompt[i] = (int64_t)(id * 100000 + i);
		struct kvp_client_slots a = {.request_id = id, .prompt = prompt, .num_prompt = len,
		                             .use_prefix_cache = true};
		rv = kvp_client_allocate_slots(c, &a, blocks, cap, &res);
		if (rv == KVP_ENOSPACE) {
			printf("request %" PRIu64 ": NO_SPACE (%s)\n", id, kvp_client_last_detail(c));
			/* A refused first call leaves no request: the retry sends the prompt again. */
			printf("    the scheduler preempts request %" PRIu64 " and sends %" PRIu64 " again\n",
			       id - 1, id);
			if ((rv = check(kvp_client_free_request(c, id - 1, true), "preempt")) ||
			    (rv = check(kvp_client_allocate_slots(c, &a, blocks, cap, &res), "retry")))
				break;
			printf("request %" PRIu64 ": scheduled after the preemption, %zu blocks\n", id,
			       res.num_new_blocks);
			break;
		}
		if (check(rv, "allocate_slots") != KVP_OK)
			break;
		if (id - first < 3 || res.num_new_blocks == 0)
			printf("request %" PRIu64 ": %u tokens, %zu blocks\n", id, len, res.num_new_blocks);
		else if (id - first == 3)
			printf("...\n");
	}
	free(prompt);
	free(blocks);
	return rv;
}

/* Blocks the pool's requests hold now (the demo is the pool's only user). */
static int
used_blocks(uint32_t *used)
{
	struct kvp_client_stats s;
	int rv = check(kvp_client_stats(c, &s), "stats");
	if (rv == KVP_OK)
		*used = s.num_blocks - 1 - s.num_free;
	return rv;
}

/* Sums a result's new blocks into per-group table lengths. */
static void
grow_tables(const struct kvp_client_slots_result *res, uint32_t *len)
{
	for (uint32_t g = 0; g < res->num_groups && g < KVP_MAX_GROUPS; g++)
		len[g] += res->new_blocks_per_group[g];
}

/* A hybrid pool: full attention keeps every block, a window group frees its old ones. */
static int
hybrid(const struct kvp_client_info *in)
{
	char spec[256];
	uint32_t table_len[KVP_MAX_GROUPS] = {0}, used;
	int64_t prompt[320];
	int32_t blocks[256];
	struct kvp_client_slots_result res;
	int rv;

	if (kvp_group_specs_format(in->groups, in->num_groups, spec, sizeof(spec)) != KVP_OK)
		snprintf(spec, sizeof(spec), "%u groups", in->num_groups);
	printf("== a hybrid pool: %s ==\n", spec);
	for (uint32_t g = 0; g < in->num_groups; g++) {
		const struct kvp_group_spec *s = &in->groups[g];
		printf("group %u: %s, %u tokens a block", g, kvp_group_kind_name(s->kind), s->block_size);
		if (s->kind == KVP_GROUP_SLIDING_WINDOW || s->kind == KVP_GROUP_CHUNKED_LOCAL)
			printf(", %s %u tokens", s->kind == KVP_GROUP_SLIDING_WINDOW ? "window" : "chunk",
			       s->window);
		printf("\n");
	}
	for (int i = 0; i < 300; i++)
		prompt[i] = 5000 + i;
	struct kvp_client_slots a = {.request_id = 1, .prompt = prompt, .num_prompt = 300,
	                             .use_prefix_cache = true};
	if ((rv = check(kvp_client_allocate_slots(c, &a, blocks, 256, &res), "allocate_slots")))
		return rv;
	grow_tables(&res, table_len);
	printf("\nrequest 1: 300 prompt tokens, new blocks per group:");
	for (uint32_t g = 0; g < res.num_groups; g++)
		printf(" %u", res.new_blocks_per_group[g]);
	printf("\n");
	for (int s = 0; s < 200; s++) {
		int64_t t = 9000 + s;
		struct kvp_client_slots d = {.request_id = 1, .new_tokens = &t,
		                             .num_new_token_ids = 1, .num_new_tokens = 1};
		if ((rv = check(kvp_client_allocate_slots(c, &d, blocks, 256, &res), "decode")))
			return rv;
		grow_tables(&res, table_len);
	}
	if ((rv = used_blocks(&used)))
		return rv;
	uint32_t tables = 0;
	for (uint32_t g = 0; g < in->num_groups; g++)
		tables += table_len[g];
	printf("    decoded 200 tokens: the block tables have %u entries, the request holds %u "
	       "blocks;\n    the %u others left a window and were freed (the null block, id 0, "
	       "stands in their place)\n", tables, used, tables - used);
	if ((rv = show_stats()))
		return rv;

	/* Request 2 shares request 1's first 256 tokens. */
	for (int i = 256; i < 300; i++)
		prompt[i] = 7000 + i;
	a.request_id = 2;
	if ((rv = check(kvp_client_allocate_slots(c, &a, blocks, 256, &res), "allocate_slots")))
		return rv;
	printf("request 2: shares the first 256 tokens: %u found cached in every group, %u "
	       "computed now;\n    new blocks per group:", res.hit_tokens, res.num_scheduled_tokens);
	for (uint32_t g = 0; g < res.num_groups; g++)
		printf(" %u", res.new_blocks_per_group[g]);
	printf(" (the window group reuses only its last blocks)\n");
	if ((rv = check(kvp_client_free_request(c, 1, false), "free")) ||
	    (rv = check(kvp_client_free_request(c, 2, false), "free")))
		return rv;
	printf("both finish: their blocks are freed and stay cached\n");
	return show_stats();
}

/* Prefill writes a prompt's K and V and caches it; a decode peer reads it back. */
static int
transfer(const struct kvp_client_options *o)
{
	const struct kvp_client_info *in = kvp_client_info(c);
	const struct kvp_client_executor *x = &in->executor;
	uint32_t bs = in->block_size, nb = 4, nt = nb * bs, nl = x->num_layers;
	size_t tok = (size_t)x->num_heads * x->head_size * (strcmp(x->dtype, "fp32") ? 2 : 4);
	size_t len = (size_t)nl * nt * tok;
	int64_t *prompt = malloc(nt * sizeof(*prompt)), *slots = malloc(nt * sizeof(*slots));
	unsigned char *k = malloc(len), *v = malloc(len), *got = malloc(nb * x->block_bytes);
	int32_t ids[4], hit[4];
	uint32_t stored, nhit, hit_tokens;
	struct kvp_client *peer = NULL;
	int rv = prompt && slots && k && v && got ? KVP_OK : KVP_ENOMEM;

	if (x->backend[0] == '\0') {
		printf("(pool %s has no executor: no block contents to move)\n", in->pool);
		goto out;
	}
	for (uint32_t i = 0; i < nt && rv == KVP_OK; i++)
		prompt[i] = 50000 + i;
	for (size_t i = 0; i < len && rv == KVP_OK; i++) {
		k[i] = (unsigned char)(i * 13 + 1);
		v[i] = (unsigned char)(i * 7 + 5);
	}
	if (rv || (rv = check(kvp_client_allocate(c, nb, ids), "allocate")))
		goto out;
	/* The slot of token t: its block's id times the block size, plus its offset. */
	for (uint32_t t = 0; t < nt; t++)
		slots[t] = (int64_t)ids[t / bs] * bs + t % bs;
	if ((rv = check(kvp_client_write_tokens(c, true, 0, slots, nt, k, v, len), "write_tokens")))
		goto out;
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = nb, .num_full_blocks = nb,
	                              .tokens = prompt, .num_tokens = nt};
	if ((rv = check(kvp_client_cache(c, &ca, &stored), "cache")) ||
	    (rv = check(kvp_client_free(c, ids, nb), "free")))
		goto out;
	printf("prefill: wrote K and V of %u tokens x %u layers into blocks %d..%d (%s, %s %s), "
	       "cached them, let them go\n", nt, nl, ids[0], ids[nb - 1], x->backend, x->dtype,
	       x->layout);
	if ((rv = check(kvp_client_open(o, &peer), "decode peer")))
		goto out;
	struct kvp_client_lookup q = {.tokens = prompt, .num_tokens = nt};
	if ((rv = kvp_client_lookup(peer, &q, hit, nb, &nhit, &hit_tokens)) != KVP_OK ||
	    (rv = kvp_client_touch(peer, hit, nhit)) != KVP_OK ||
	    (rv = kvp_client_read_blocks(peer, hit, nhit, got, nhit * x->block_bytes, NULL))) {
		fprintf(stderr, "kvpool-demo: decode peer: %s\n", kvp_client_last_detail(peer));
		goto out;
	}
	/* Block b's payload is, per layer, K then V of its bs tokens: compare with the source. */
	bool same = nhit == nb;
	for (uint32_t b = 0; same && b < nb; b++)
		for (uint32_t l = 0; l < nl; l++) {
			const unsigned char *p = got + b * x->block_bytes + (size_t)l * 2 * bs * tok;
			const unsigned char *src = k + ((size_t)l * nt + (size_t)b * bs) * tok;
			same = same && memcmp(p, src, bs * tok) == 0 &&
			       memcmp(p + bs * tok, v + ((size_t)l * nt + (size_t)b * bs) * tok, bs * tok) == 0;
		}
	printf("decode peer: prefix hit of %u tokens, read %u blocks (%" PRIu64 " KiB), checksums "
	       "verified, bytes %s\n", hit_tokens, nhit, nhit * x->block_bytes >> 10,
	       same ? "identical to what prefill wrote" : "DIFFERENT");
	if (!same)
		rv = KVP_EINTERNAL;
	(void)kvp_client_free(peer, hit, nhit);
out:
	kvp_client_close(peer);
	free(prompt);
	free(slots);
	free(k);
	free(v);
	free(got);
	return rv;
}

int
main(int argc, char **argv)
{
	struct kvp_client_options o = {.url = argc > 1 ? argv[1] : KVP_DEFAULT_RPC_URL,
	                               .pool = argc > 2 ? argv[2] : "default",
	                               .client_name = "kvpool-demo", .timeout_ms = 3000,
	                               .retries = 5};
	int rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK) {
		fprintf(stderr, "kvpool-demo: cannot open a session on %s: %s\n", o.url,
		        kvp_strerror(rv));
		return 1;
	}
	const struct kvp_client_info *in = kvp_client_info(c);
	printf("session %" PRIu64 " on pool %s: %u blocks of %u tokens, %s, medium %s, lease %u ms\n\n",
	       in->session_id, in->pool, in->num_blocks, in->block_size, in->hash_algorithm,
	       in->medium, in->lease_ms);
	if (in->num_groups > 1) {
		rv = hybrid(in);
		goto out;
	}

	printf("== four chats share a 48-token system prompt ==\n");
	if ((rv = chat(1, 30, 8)) || (rv = chat(2, 25, 8)) || (rv = chat(3, 40, 4)) ||
	    (rv = chat(4, 12, 0)) || (rv = show_stats()))
		goto out;
	printf("requests 1 and 2 finish: their blocks are freed but stay cached\n");
	if ((rv = check(kvp_client_free_request(c, 1, false), "free")) ||
	    (rv = check(kvp_client_free_request(c, 2, false), "free")) || (rv = show_stats()) ||
	    (rv = chat(5, 20, 0)))
		goto out;

	printf("\n== a prefill peer hands a prompt's KV to a decode peer ==\n");
	if ((rv = transfer(&o)))
		goto out;

	printf("\n== a burst of long prompts fills the pool ==\n");
	if ((rv = burst(in)) || (rv = show_stats()))
		goto out;
	printf("\nGoodbye: the session's requests and blocks are released\n");
	kvp_client_close(c);
	c = NULL;
	if ((rv = check(kvp_client_open(&o, &c), "reopen")) == KVP_OK)
		rv = show_stats();
out:
	kvp_client_close(c);
	return rv == KVP_OK ? 0 : 1;
}
