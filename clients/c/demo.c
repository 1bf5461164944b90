/*
 * kvpool-demo: a scheduler's session with kvpoold, for a newcomer to watch.
 *
 * Chat requests that share a system prompt are scheduled through the
 * request-level calls (AllocateSlots, FreeRequest): the first computes the
 * prompt, the others find it cached. Then a burst of long requests fills the
 * pool until the daemon answers NO_SPACE and the scheduler preempts, and
 * finished requests' blocks stay cached until allocation evicts them.
 *
 * usage: kvpool-demo [URL] [POOL]   (defaults: ipc:///tmp/kvpool.ipc default)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"

static struct kvp_client *c;

static void
check(int rv, const char *what)
{
	if (rv != KVP_OK) {
		fprintf(stderr, "kvpool-demo: %s: %s (%s): %s\n", what, kvp_strerror(rv),
		        kvp_status_name(rv), kvp_client_last_detail(c));
		kvp_client_close(c);
		exit(1);
	}
}

static void
show_stats(void)
{
	struct kvp_client_stats s;
	check(kvp_client_stats(c, &s), "stats");
	printf("    pool: %u of %u blocks free, %u hold cached prefixes, usage %.1f%%; "
	       "prefix cache hit %" PRIu64 " of %" PRIu64 " prompt tokens; %" PRIu64 " evicted\n",
	       s.num_free, s.num_blocks - 1, s.num_cached_blocks, s.usage * 100.0, s.prefix_hits,
	       s.prefix_queries, s.blocks_evicted);
}

/* A chat request: the shared system prompt, then its own message. */
static void
chat(uint64_t id, int user_tokens, int decode_steps)
{
	int64_t prompt[256];
	int n = 0;
	int32_t blocks[64];
	struct kvp_client_slots_result res;

	for (int i = 0; i < 48; i++)
		prompt[n++] = 1000 + i;
	for (int i = 0; i < user_tokens; i++)
		prompt[n++] = (int64_t)(id * 1000 + (uint64_t)i);
	struct kvp_client_slots a = {.request_id = id, .prompt = prompt, .num_prompt = (size_t)n,
	                             .use_prefix_cache = true};
	check(kvp_client_allocate_slots(c, &a, blocks, 64, &res), "allocate_slots");
	printf("request %" PRIu64 ": %d prompt tokens, %u found cached, %u computed now, %zu new "
	       "block(s)\n", id, n, res.hit_tokens, res.num_scheduled_tokens, res.num_new_blocks);
	for (int s = 0; s < decode_steps; s++) {
		int64_t t = 7000 + s;
		struct kvp_client_slots d = {.request_id = id, .new_tokens = &t,
		                             .num_new_token_ids = 1, .num_new_tokens = 1};
		check(kvp_client_allocate_slots(c, &d, blocks, 64, &res), "decode");
	}
	if (decode_steps > 0)
		printf("    decoded %d tokens (%u computed in all)\n", decode_steps,
		       res.num_computed_tokens);
}

int
main(int argc, char **argv)
{
	struct kvp_client_options o = {.url = argc > 1 ? argv[1] : "ipc:///tmp/kvpool.ipc",
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

	printf("== four chats share a 48-token system prompt ==\n");
	chat(1, 30, 8);
	chat(2, 25, 8);
	chat(3, 40, 4);
	chat(4, 12, 0);
	show_stats();
	printf("requests 1 and 2 finish: their blocks are freed but stay cached\n");
	check(kvp_client_free_request(c, 1, false), "free");
	check(kvp_client_free_request(c, 2, false), "free");
	show_stats();
	chat(5, 20, 0);

	printf("\n== a burst of long prompts fills the pool ==\n");
	uint32_t len = in->max_model_len < 4096 ? in->max_model_len : 4096;
	int64_t *prompt = malloc(len * sizeof(*prompt));
	int32_t *blocks = malloc((len / in->block_size + 2) * sizeof(*blocks));
	uint64_t id = 100, first = 100;
	for (;; id++) {
		struct kvp_client_slots_result res;
		for (uint32_t i = 0; i < len; i++)
			prompt[i] = (int64_t)(id * 100000 + i);
		struct kvp_client_slots a = {.request_id = id, .prompt = prompt, .num_prompt = len,
		                             .use_prefix_cache = true};
		rv = kvp_client_allocate_slots(c, &a, blocks, len / in->block_size + 2, &res);
		if (rv == KVP_ENOSPACE) {
			printf("request %" PRIu64 ": NO_SPACE (%s)\n", id, kvp_client_last_detail(c));
			printf("    the scheduler preempts request %" PRIu64 " and retries\n", id - 1);
			check(kvp_client_free_request(c, id - 1, true), "preempt");
			check(kvp_client_allocate_slots(c, &(struct kvp_client_slots){
			                                        .request_id = id, .use_prefix_cache = true},
			                                blocks, len / in->block_size + 2, &res),
			      "retry");
			printf("request %" PRIu64 ": scheduled after the preemption, %zu blocks\n", id,
			       res.num_new_blocks);
			break;
		}
		check(rv, "allocate_slots");
		if (id - first < 3 || res.num_new_blocks == 0)
			printf("request %" PRIu64 ": %u tokens, %zu blocks\n", id, len, res.num_new_blocks);
		else if (id - first == 3)
			printf("...\n");
	}
	show_stats();
	free(prompt);
	free(blocks);
	printf("\nGoodbye: the session's requests and blocks are released\n");
	kvp_client_close(c);
	c = NULL;
	kvp_client_open(&o, &c);
	show_stats();
	kvp_client_close(c);
	return 0;
}
