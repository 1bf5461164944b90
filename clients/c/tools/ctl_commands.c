/* SPDX-License-Identifier: Apache-2.0 */
/* kvpoolctl's commands that call the daemon (see kvpoolctl.h). */
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/tools/kvpoolctl.h"
#include "common/crc32c.h"

int32_t *
ctl_to_ids(const int64_t *v, size_t n)
{
	int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
	for (size_t i = 0; ids && i < n; i++)
		ids[i] = v[i] < INT32_MIN || v[i] > INT32_MAX ? -1 : (int32_t)v[i];
	return ids;
}

cJSON *
ctl_ids_json(const int32_t *ids, size_t n)
{
	cJSON *a = cJSON_CreateArray();
	for (size_t i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
	return a;
}

void
ctl_print_ids(const char *label, const int32_t *ids, size_t n)
{
	printf("%s", label);
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	printf("\n");
}

static unsigned char *
slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	long n;
	if (f == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n) {
		*len = (size_t)n;
	} else {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	return buf;
}


int
run_info(struct ctl *x)
{
	const struct kvp_client_info *in = kvp_client_info(x->c);
	cJSON *j = x->j;
	bool info = x->cmd->bit == C_INFO;
	char fp[17], sid[24];

	for (int k = 0; k < 8; k++)
		snprintf(fp + 2 * k, 3, "%02x", in->none_hash_fingerprint[k]);
	cJSON_AddStringToObject(j, "pool", in->pool);
	snprintf(sid, sizeof(sid), "%" PRIu64, in->session_id);
	cJSON_AddStringToObject(j, "session_id", sid); /* 64 bits: not a JSON double */
	cJSON_AddNumberToObject(j, "lease_ms", in->lease_ms);
	cJSON_AddNumberToObject(j, "num_blocks", in->num_blocks);
	cJSON_AddNumberToObject(j, "block_size", in->block_size);
	cJSON_AddNumberToObject(j, "hash_block_size", in->hash_block_size);
	cJSON_AddStringToObject(j, "hash_algorithm", in->hash_algorithm);
	cJSON_AddNumberToObject(j, "hash_len", in->hash_len);
	cJSON_AddBoolToObject(j, "prefix_caching", in->prefix_caching);
	cJSON *ga = cJSON_AddArrayToObject(j, "groups");
	for (uint32_t g = 0; g < in->num_groups; g++) {
		const struct kvp_group_spec *s = &in->groups[g];
		cJSON *go = cJSON_CreateObject();
		cJSON_AddNumberToObject(go, "group_id", g);
		cJSON_AddStringToObject(go, "kind", kvp_group_kind_name(s->kind));
		cJSON_AddNumberToObject(go, "block_size", s->block_size);
		if (s->kind == KVP_GROUP_SLIDING_WINDOW)
			cJSON_AddNumberToObject(go, "sliding_window", s->window);
		if (s->kind == KVP_GROUP_CHUNKED_LOCAL)
			cJSON_AddNumberToObject(go, "attention_chunk_size", s->window);
		if (s->kind == KVP_GROUP_MAMBA)
			cJSON_AddStringToObject(go, "mamba_cache_mode", kvp_mamba_mode_name(s->mamba_mode));
		cJSON_AddItemToArray(ga, go);
	}
	cJSON_AddStringToObject(j, "none_hash_fingerprint", fp);
	cJSON_AddStringToObject(j, "medium", in->medium);
	cJSON_AddNumberToObject(j, "max_model_len", in->max_model_len);
	cJSON_AddNumberToObject(j, "max_ids_per_call", in->max_ids_per_call);
	cJSON_AddNumberToObject(j, "max_msg_bytes", in->max_msg_bytes);
	if (in->server_version[0])
		cJSON_AddStringToObject(j, "server_version", in->server_version);
	const struct kvp_client_executor *e = &in->executor;
	if (e->backend[0]) {
		cJSON *o = cJSON_AddObjectToObject(j, "executor");
		cJSON_AddStringToObject(o, "backend", e->backend);
		cJSON_AddNumberToObject(o, "num_layers", e->num_layers);
		cJSON_AddNumberToObject(o, "num_heads", e->num_heads);
		cJSON_AddNumberToObject(o, "head_size", e->head_size);
		cJSON_AddStringToObject(o, "dtype", e->dtype);
		cJSON_AddStringToObject(o, "layout", e->layout);
		cJSON_AddNumberToObject(o, "block_bytes", (double)e->block_bytes);
		cJSON_AddNumberToObject(o, "memory_bytes", (double)e->memory_bytes);
	}
	if (x->json)
		return KVP_OK;
	if (!info) {
		printf("%" PRIu64 "\n", in->session_id);
		return KVP_OK;
	}
	char groups[256];
	if (kvp_group_specs_format(in->groups, in->num_groups, groups, sizeof(groups)) != KVP_OK)
		snprintf(groups, sizeof(groups), "(%u groups)", in->num_groups);
	if (e->backend[0])
		printf("executor %s: %u layers x K,V x [%u tokens, %u heads, %u] %s (%s), %" PRIu64
		       " bytes a block, %" PRIu64 " MiB in all\n", e->backend, e->num_layers,
		       e->block_size, e->num_heads, e->head_size, e->dtype, e->layout, e->block_bytes,
		       e->memory_bytes >> 20);
	else
		printf("executor: none (the pool keeps no block contents)\n");
	printf("pool %s: %u blocks of %u tokens, %s (NONE_HASH fingerprint %s), medium %s, "
	       "max_model_len %u, %u ids per call\n", in->pool, in->num_blocks, in->block_size,
	       in->hash_algorithm, fp, in->medium, in->max_model_len, in->max_ids_per_call);
	printf("groups %s (hash block size %u), prefix caching %s\n", groups, in->hash_block_size,
	       in->prefix_caching ? "on" : "off");
	if (in->server_version[0])
		printf("kvpoold %s\n", in->server_version);
	return KVP_OK;
}

int
run_stats(struct ctl *x)
{
	struct kvp_client_stats s;
	int rv = kvp_client_stats(x->c, &s);
	cJSON *j = x->j;
	if (rv != KVP_OK)
		return rv;
	cJSON_AddNumberToObject(j, "num_blocks", s.num_blocks);
	cJSON_AddNumberToObject(j, "num_free", s.num_free);
	cJSON_AddNumberToObject(j, "num_cached_blocks", s.num_cached_blocks);
	cJSON_AddNumberToObject(j, "num_cached_keys", s.num_cached_keys);
	cJSON_AddNumberToObject(j, "usage", s.usage);
	cJSON_AddNumberToObject(j, "blocks_allocated", (double)s.blocks_allocated);
	cJSON_AddNumberToObject(j, "blocks_evicted", (double)s.blocks_evicted);
	cJSON_AddNumberToObject(j, "alloc_failures", (double)s.alloc_failures);
	cJSON_AddNumberToObject(j, "prefix_queries", (double)s.prefix_queries);
	cJSON_AddNumberToObject(j, "prefix_hits", (double)s.prefix_hits);
	cJSON_AddNumberToObject(j, "sessions", s.sessions);
	cJSON_AddNumberToObject(j, "leases_expired", (double)s.leases_expired);
	cJSON_AddNumberToObject(j, "events_emitted", (double)s.events_emitted);
	cJSON_AddNumberToObject(j, "active_requests", s.active_requests);
	if (!x->json)
		printf("blocks %u, free %u, cached %u (%u keys), usage %.1f%%\n"
		       "allocated %" PRIu64 ", evicted %" PRIu64 ", failed allocations %" PRIu64
		       "\nprefix cache: %" PRIu64 " of %" PRIu64 " tokens hit\n"
		       "sessions %u, leases expired %" PRIu64 ", events %" PRIu64 ", requests %u\n",
		       s.num_blocks, s.num_free, s.num_cached_blocks, s.num_cached_keys,
		       s.usage * 100.0, s.blocks_allocated, s.blocks_evicted, s.alloc_failures,
		       s.prefix_hits, s.prefix_queries, s.sessions, s.leases_expired,
		       s.events_emitted, s.active_requests);
	return KVP_OK;
}

int
run_end(struct ctl *x)
{
	kvp_client_close(x->c); /* Goodbye */
	x->c = NULL;
	if (!x->json)
		printf("session %" PRIu64 " ended\n", x->o.session_id);
	return KVP_OK;
}

int
run_alloc(struct ctl *x)
{
	int32_t *ids = malloc(x->alloc_n * sizeof(*ids));
	int rv;
	if (ids == NULL)
		return KVP_ENOMEM;
	if ((rv = kvp_client_allocate(x->c, x->alloc_n, ids)) == KVP_OK) {
		cJSON_AddItemToObject(x->j, "block_ids", ctl_ids_json(ids, x->alloc_n));
		if (!x->json)
			ctl_print_ids("", ids, x->alloc_n);
		if (x->o.session_id == 0)
			fprintf(stderr, "kvpoolctl: note: these blocks are released when this session "
			                "ends; use `kvpoolctl session` and --session to keep them\n");
	}
	free(ids);
	return rv;
}

int
run_ids(struct ctl *x)
{
	int32_t *ids = ctl_to_ids(x->ids, x->nids);
	uint32_t evicted = 0;
	int rv;
	if (ids == NULL)
		return KVP_ENOMEM;
	if (x->cmd->bit == C_FREE)
		rv = kvp_client_free(x->c, ids, x->nids);
	else if (x->cmd->bit == C_TOUCH)
		rv = kvp_client_touch(x->c, ids, x->nids);
	else
		rv = kvp_client_evict(x->c, ids, x->nids, &evicted);
	if (rv == KVP_OK) {
		cJSON_AddItemToObject(x->j, "block_ids", ctl_ids_json(ids, x->nids));
		if (x->cmd->bit == C_EVICT)
			cJSON_AddNumberToObject(x->j, "num_evicted", evicted);
		if (!x->json && x->cmd->bit == C_EVICT)
			printf("%u of %zu block(s) evicted\n", evicted, x->nids);
		else if (!x->json)
			printf("ok\n");
	}
	free(ids);
	return rv;
}

int
run_reset(struct ctl *x)
{
	int rv = kvp_client_reset(x->c);
	if (rv == KVP_OK && !x->json)
		printf("prefix cache cleared\n");
	return rv;
}

int
run_cache(struct ctl *x)
{
	int32_t *ids = ctl_to_ids(x->ids, x->nids);
	uint32_t bs = kvp_client_info(x->c)->block_size, stored = 0;
	int rv;
	if (ids == NULL)
		return KVP_ENOMEM;
	if (bs == 0) {
		/* A resumed session skipped Hello: ask a short-lived one. */
		struct kvp_client_options oo = x->o;
		struct kvp_client *tmp = NULL;
		oo.session_id = 0;
		if (kvp_client_open(&oo, &tmp) == KVP_OK)
			bs = kvp_client_info(tmp)->block_size;
		kvp_client_close(tmp);
	}
	uint32_t full = (uint32_t)(x->ntoks / (bs ? bs : 1));
	if (full > x->nids)
		full = (uint32_t)x->nids;
	struct kvp_client_cache a = {.block_ids = ids, .num_block_ids = x->nids,
	                             .num_cached_blocks = x->num_cached, .num_full_blocks = full,
	                             .tokens = x->toks, .num_tokens = x->ntoks,
	                             .keys = x->lora || x->salt ? &x->keys : NULL};
	if ((rv = kvp_client_cache(x->c, &a, &stored)) == KVP_OK) {
		cJSON_AddNumberToObject(x->j, "num_stored", stored);
		if (!x->json)
			printf("%u block(s) cached\n", stored);
	}
	free(ids);
	return rv;
}

int
run_lookup(struct ctl *x)
{
	int32_t *hits = malloc((x->ntoks + 1) * sizeof(*hits));
	uint32_t nh = 0, ht = 0;
	int rv;
	if (hits == NULL)
		return KVP_ENOMEM;
	struct kvp_client_lookup q = {.tokens = x->toks, .num_tokens = x->ntoks,
	                              .keys = x->lora || x->salt ? &x->keys : NULL};
	if ((rv = kvp_client_lookup(x->c, &q, hits, x->ntoks + 1, &nh, &ht)) == KVP_OK) {
		cJSON_AddItemToObject(x->j, "block_ids", ctl_ids_json(hits, nh));
		cJSON_AddNumberToObject(x->j, "hit_tokens", ht);
		if (!x->json) {
			printf("hit %u tokens in %u block(s): ", ht, nh);
			ctl_print_ids("", hits, nh);
		}
	}
	free(hits);
	return rv;
}

int
run_snapshot(struct ctl *x)
{
	struct kvp_snapshot *snap = NULL;
	int rv = kvp_client_snapshot(x->c, &snap);
	if (rv != KVP_OK)
		return rv;
	cJSON *arr = cJSON_CreateArray();
	char ep[24];
	snprintf(ep, sizeof(ep), "%" PRIu64, snap->epoch);
	cJSON_AddStringToObject(x->j, "epoch", ep);
	cJSON_AddNumberToObject(x->j, "next_seq", (double)snap->next_seq);
	for (size_t k = 0; k < snap->num_entries; k++) {
		const struct kvp_snapshot_entry *e = &snap->entries[k];
		cJSON *o = cJSON_CreateObject();
		char hex[2 * 1024 + 1];
		ctl_hex_into(hex, e->hash, e->hash_len < 1024 ? e->hash_len : 1024);
		cJSON_AddStringToObject(o, "hash", hex);
		cJSON_AddNumberToObject(o, "group", e->group_idx);
		cJSON_AddNumberToObject(o, "blocks", e->num_blocks);
		cJSON_AddItemToArray(arr, o);
		if (!x->json)
			printf("%s group %u blocks %u\n", hex, e->group_idx, e->num_blocks);
	}
	cJSON_AddItemToObject(x->j, "entries", arr);
	if (!x->json)
		printf("%zu cached (hash, group) entries; epoch %" PRIu64 ", next seq %" PRIu64 "\n",
		       snap->num_entries, snap->epoch, snap->next_seq);
	kvp_snapshot_free(snap);
	return KVP_OK;
}

/* read / write / copy: block contents to and from files. */
int
run_data(struct ctl *x)
{
	uint64_t bb = kvp_client_info(x->c)->executor.block_bytes;
	size_t n = x->nids, len = 0;
	unsigned char *buf = NULL;
	int32_t *ids = ctl_to_ids(x->ids, n), *dst = NULL;
	uint32_t *crcs = NULL;
	int rv = KVP_ENOMEM;

	if (ids == NULL)
		goto out;
	if (bb == 0) {
		fail(x, EXIT_REFUSED, KVP_ENOTSUP, "pool %s has no executor: it keeps no block contents",
		     kvp_client_info(x->c)->pool);
		rv = LOCAL_FAILURE;
		goto out;
	}
	if (x->cmd->bit == C_COPY) {
		if ((dst = ctl_to_ids(x->dst, n)) == NULL)
			goto out;
		if ((rv = kvp_client_copy_blocks(x->c, ids, dst, n)) == KVP_OK && !x->json)
			printf("copied %zu block(s)\n", n);
	} else if (x->cmd->bit == C_READ) {
		FILE *f;
		size_t nd = 0;
		if ((buf = malloc(n * bb)) == NULL || (crcs = malloc(n * sizeof(*crcs))) == NULL ||
		    (dst = malloc(n * sizeof(*dst))) == NULL)
			goto out;
		/* The daemon reads only blocks the session holds: a reference of our own on each
		 * block named (once), for the read, so it cannot be reused under us. */
		for (size_t i = 0; i < n; i++) {
			bool seen = false;
			for (size_t k = 0; k < nd && !seen; k++)
				seen = dst[k] == ids[i];
			if (!seen)
				dst[nd++] = ids[i];
		}
		if ((rv = kvp_client_touch(x->c, dst, nd)) != KVP_OK)
			goto out;
		rv = kvp_client_read_blocks(x->c, ids, n, buf, n * bb, crcs);
		int fr = kvp_client_free(x->c, dst, nd);
		if (rv == KVP_OK)
			rv = fr;
		if (rv != KVP_OK)
			goto out;
		if ((f = fopen(x->out, "wb")) == NULL || fwrite(buf, 1, n * bb, f) != n * bb ||
		    fclose(f) != 0) {
			fail(x, EXIT_LOCAL, KVP_EINTERNAL, "cannot write %s: %s", x->out, strerror(errno));
			rv = LOCAL_FAILURE;
			goto out;
		}
		cJSON *arr = cJSON_AddArrayToObject(x->j, "crc32c");
		for (size_t i = 0; i < n; i++) {
			char h[9];
			snprintf(h, sizeof(h), "%08x", crcs[i]);
			cJSON_AddItemToArray(arr, cJSON_CreateString(h));
		}
		cJSON_AddNumberToObject(x->j, "bytes", (double)(n * bb));
		if (!x->json)
			printf("read %zu block(s), %" PRIu64 " bytes, checksums verified, to %s\n", n,
			       (uint64_t)(n * bb), x->out);
	} else {
		if ((buf = slurp(x->in, &len)) == NULL) {
			fail(x, EXIT_LOCAL, KVP_EINVAL, "cannot read %s: %s", x->in, strerror(errno));
			rv = LOCAL_FAILURE;
			goto out;
		}
		if (len != n * bb) {
			fail(x, EXIT_USAGE, KVP_EINVAL, "%s has %zu bytes; %zu block(s) take %" PRIu64,
			     x->in, len, n, (uint64_t)(n * bb));
			rv = LOCAL_FAILURE;
			goto out;
		}
		if ((rv = kvp_client_write_blocks(x->c, ids, n, buf, len)) == KVP_OK && !x->json)
			printf("wrote %zu block(s), %zu bytes\n", n, len);
	}
	if (rv == KVP_OK)
		cJSON_AddItemToObject(x->j, "block_ids", ctl_ids_json(ids, n));
out:
	free(ids);
	free(dst);
	free(buf);
	free(crcs);
	return rv;
}

/* region [ROW]: the shared region's shape; a row's checksum and first bytes (this host only). */
int
run_region(struct ctl *x)
{
	struct kvp_region *r = NULL;
	cJSON *j = x->j;
	int rv = kvp_region_open(x->c, &r);
	if (rv != KVP_OK)
		return rv;
	const struct kvp_region_info *i = kvp_region_info(r);
	cJSON_AddStringToObject(j, "path", i->path);
	cJSON_AddNumberToObject(j, "bytes", (double)i->bytes);
	cJSON_AddNumberToObject(j, "row_bytes", (double)i->row_bytes);
	cJSON_AddNumberToObject(j, "row_stride", (double)i->row_stride);
	cJSON_AddNumberToObject(j, "num_rows", i->num_rows);
	cJSON_AddNumberToObject(j, "shards", i->shards);
	cJSON_AddNumberToObject(j, "shard_bytes", (double)i->shard_bytes);
	if (!x->json)
		printf("region %s: %u rows of %" PRIu64 " bytes (every %" PRIu64 "), %" PRIu64
		       " bytes in all; %u shard(s) of %" PRIu64 " bytes\n",
		       i->path, i->num_rows, i->row_bytes, i->row_stride, i->bytes, i->shards,
		       i->shard_bytes);
	if (x->row != 0) {
		const unsigned char *p = kvp_region_row(r, x->row);
		char hex[2 * 32 + 1];
		if (p == NULL) {
			uint32_t last = i->num_rows - 1; /* i lives in r */
			kvp_region_close(r);
			return fail(x, EXIT_REFUSED, KVP_ERANGE, "row %d is outside 1..%u", x->row, last),
			       LOCAL_FAILURE;
		}
		size_t head = i->row_bytes < 32 ? (size_t)i->row_bytes : 32;
		uint32_t crc = kvp_crc32c(0, p, (size_t)i->row_bytes);
		ctl_hex_into(hex, p, head);
		cJSON_AddNumberToObject(j, "row", x->row);
		cJSON_AddNumberToObject(j, "crc32c", crc);
		cJSON_AddStringToObject(j, "head", hex);
		if (!x->json)
			printf("row %d: crc32c %08x, first bytes %s\n", x->row, crc, hex);
		if (x->out != NULL) {
			FILE *f = fopen(x->out, "wb");
			bool ok = f != NULL && fwrite(p, 1, (size_t)i->row_bytes, f) == i->row_bytes;
			if (f != NULL && fclose(f) != 0)
				ok = false;
			if (!ok) {
				int e = errno;
				kvp_region_close(r);
				return fail(x, EXIT_LOCAL, KVP_EINVAL, "cannot write %s: %s", x->out,
				            strerror(e)), LOCAL_FAILURE;
			}
		}
	}
	kvp_region_close(r);
	return KVP_OK;
}
