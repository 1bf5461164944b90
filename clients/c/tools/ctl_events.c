/* SPDX-License-Identifier: Apache-2.0 */
/* kvpoolctl events and vllm-events: following kvpool's stream and vLLM's wire. */
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/tools/kvpoolctl.h"
#include "clients/c/subscriber.h"
#include "clients/c/tools/vllm_watch.h"
#include "proto/wire.h"

/* ---- events ---- */

struct follow {
	const char *pool;
	unsigned long printed, max;
};

static void
print_event(struct follow *f, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
            const struct kvp_event *ev)
{
	cJSON *o = cJSON_CreateObject(), *hashes = cJSON_CreateArray(), *ids = cJSON_CreateArray();
	char buf[2 * 1024 + 1], num[24];
	static const char *const names[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};

	cJSON_AddStringToObject(o, "pool", pool);
	snprintf(num, sizeof(num), "%" PRIu64, epoch);
	cJSON_AddStringToObject(o, "epoch", num);
	cJSON_AddNumberToObject(o, "seq", (double)seq);
	cJSON_AddNumberToObject(o, "ts", (double)ts / 1e9);
	cJSON_AddStringToObject(o, "type", names[ev->type]);
	for (uint32_t h = 0; h < ev->num_hashes && ev->hash_len <= 1024; h++) {
		const uint8_t *p = ev->hashes + (size_t)h * ev->hash_len;
		ctl_hex_into(buf, p, ev->hash_len);
		cJSON_AddItemToArray(hashes, cJSON_CreateString(buf));
		snprintf(num, sizeof(num), "%" PRIu64, kvp_hash_event_id(p, ev->hash_len));
		cJSON_AddItemToArray(ids, cJSON_CreateString(num)); /* u64: strings, not doubles */
	}
	if (ev->type != KVP_EVENT_ALL_CLEARED) {
		cJSON_AddItemToObject(o, "block_hashes", hashes);
		cJSON_AddItemToObject(o, "block_hash_ids", ids);
		cJSON_AddStringToObject(o, "medium", ev->medium ? ev->medium : "");
		cJSON_AddNumberToObject(o, "group_idx", ev->group_idx);
	} else {
		cJSON_Delete(hashes);
		cJSON_Delete(ids);
	}
	if (ev->type == KVP_EVENT_BLOCK_STORED) {
		if (ev->parent && ev->hash_len <= 1024) {
			ctl_hex_into(buf, ev->parent, ev->hash_len);
			cJSON_AddStringToObject(o, "parent_block_hash", buf);
		} else {
			cJSON_AddNullToObject(o, "parent_block_hash");
		}
		cJSON *toks = cJSON_CreateArray(), *extra = cJSON_CreateArray();
		for (uint32_t t = 0; t < ev->num_tokens; t++)
			cJSON_AddItemToArray(toks, cJSON_CreateNumber((double)ev->token_ids[t]));
		cJSON_AddItemToObject(o, "token_ids", toks);
		cJSON_AddNumberToObject(o, "block_size", ev->block_size);
		if (ev->has_lora_id)
			cJSON_AddNumberToObject(o, "lora_id", (double)ev->lora_id);
		else
			cJSON_AddNullToObject(o, "lora_id");
		if (ev->lora_name)
			cJSON_AddStringToObject(o, "lora_name", ev->lora_name);
		else
			cJSON_AddNullToObject(o, "lora_name");
		for (uint32_t h = 0; h < ev->num_hashes; h++) {
			uint32_t a = ev->extra_key_offsets[h], b = ev->extra_key_offsets[h + 1];
			if (b - a <= 1024) {
				ctl_hex_into(buf, ev->extra_keys + a, b - a);
				cJSON_AddItemToArray(extra, cJSON_CreateString(buf)); /* canonical CBOR */
			}
		}
		cJSON_AddItemToObject(o, "extra_keys_cbor", extra);
		cJSON_AddStringToObject(o, "kv_cache_spec_kind", ev->spec_kind ? ev->spec_kind : "");
	}
	char *s = cJSON_PrintUnformatted(o);
	if (s) {
		printf("%s\n", s);
		fflush(stdout);
	}
	free(s);
	cJSON_Delete(o);
	f->printed++;
}

static void
on_events(void *ctx, const char *pool, uint64_t epoch, uint64_t seq, uint64_t ts,
         const struct kvp_event_batch *b)
{
	struct follow *f = ctx;
	for (size_t i = 0; i < kvp_event_batch_count(b) && (f->max == 0 || f->printed < f->max); i++) {
		struct kvp_event ev;
		(void)kvp_event_batch_get(b, i, &ev);
		print_event(f, pool, epoch, seq, ts, &ev);
	}
}

static void
on_reset(void *ctx, const char *pool, uint64_t epoch, uint64_t next_seq,
         const struct kvp_snapshot_entry *e, size_t n)
{
	char ep[24];
	(void)ctx;
	(void)e;
	snprintf(ep, sizeof(ep), "%" PRIu64, epoch);
	printf("{\"pool\":\"%s\",\"epoch\":\"%s\",\"next_seq\":%" PRIu64
	       ",\"type\":\"Reset\",\"cached_entries\":%zu}\n", pool, ep, next_seq, n);
	fflush(stdout);
}

/* Reads a whole file into a new buffer. NULL (errno set) on failure. */
int
ctl_follow_events(struct ctl *x)
{
	const struct kvp_client_options *o = &x->o;
	const char *url = x->events_url ? x->events_url : KVP_DEFAULT_EVENTS_URL;
	struct follow f = {.pool = o->pool, .max = x->count};
	struct kvp_sub_options so = {.events_url = url, .rpc_url = o->url, .pool = o->pool,
	                             .token = o->token, .timeout_ms = o->timeout_ms,
	                             .tls_ca_file = o->tls_ca_file, .tls_cert_file = o->tls_cert_file,
	                             .tls_key_file = o->tls_key_file,
	                             .tls_server_name = o->tls_server_name,
	                             .connect_timeout_ms = o->connect_timeout_ms,
	                             .tls_insecure = o->tls_insecure};
	struct kvp_sub_handler h = {.ctx = &f, .reset = on_reset, .batch = on_events};
	struct kvp_sub *sub = NULL;
	int rv = kvp_sub_open(&so, &h, &sub);

	if (rv != KVP_OK)
		return fail(x, exit_of(rv), rv, "cannot follow %s (pool %s): %s", url, o->pool,
		            kvp_strerror(rv));
	/* Without --follow: what arrives within a second. */
	for (int rounds = 0; x->follow || rounds < 10; rounds++) {
		if ((rv = kvp_sub_poll(sub, 100)) != KVP_OK)
			fprintf(stderr, "kvpoolctl: %s: %s\n", kvp_strerror(rv), kvp_sub_last_detail(sub));
		if (x->count && f.printed >= x->count)
			break;
	}
	kvp_sub_close(sub);
	return EXIT_OK;
}

int
ctl_vllm_events(struct ctl *x)
{
	struct kvp_vllm_watch_options w = {
		.url = x->vllm_url ? x->vllm_url : KVP_DEFAULT_VLLM_URL,
		.replay_url = x->replay_url,
		.topic = x->topic ? x->topic : "",
		.bind = x->bind,
		.follow = x->follow,
		.has_from = x->has_from,
		.from = x->from,
		.max = x->count,
		.timeout_ms = x->o.timeout_ms ? (int)x->o.timeout_ms : 5000,
	};
	return kvp_vllm_watch(&w) == 0 ? EXIT_OK : EXIT_UNREACHABLE;
}
