/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool spec (--pool, KVPOOL_POOL, pool = ...): parsed into one pool's
 * settings; its KV cache groups defaulted as vLLM does and checked.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/block_hash.h"
#include "common/kvp_status.h"
#include "gpu/executor.h"
#include "service/config/config.h"
#include "service/config/config_impl.h"

/*
 * A token as given (a file's content or a flag's value): surrounding white
 * space trimmed; empty, NUL-bearing or over-long tokens refused, since each
 * would start a pool with no authentication or one nobody can present.
 * Never echoes the token. 0 or -1 (why on err).
 */
int
kvpd_cfg_take_token(const char *src, size_t n, const char *what, char *dst, FILE *err)
{
	while (n > 0 && isspace((unsigned char)src[n - 1]))
		n--;
	while (n > 0 && isspace((unsigned char)*src)) {
		src++;
		n--;
	}
	if (n > 0 && memchr(src, '\0', n) != NULL) {
		fprintf(err, "kvpoold: %s: the token has a NUL byte in it\n", what);
		return -1;
	}
	if (n == 0) {
		fprintf(err, "kvpoold: %s: the token is empty (a pool without a token takes no "
		             "token_file and no token)\n", what);
		return -1;
	}
	if (n > KVPD_TOKEN_MAX - 1) {
		fprintf(err, "kvpoold: %s: the token is %zu bytes, longer than %d\n", what, n,
		        KVPD_TOKEN_MAX - 1);
		return -1;
	}
	memcpy(dst, src, n);
	dst[n] = '\0';
	return 0;
}

int
kvpd_cfg_read_token(const char *path, char *dst, FILE *err)
{
	enum { CAP = 4096 }; /* room for a token and generous white space around it */
	char buf[CAP + 1], what[KVPD_PATH_MAX + 16];
	struct stat sb;
	FILE *f = fopen(path, "r");
	size_t n;
	int rv;

	snprintf(what, sizeof(what), "token file %s", path);
	if (f == NULL) {
		fprintf(err, "kvpoold: %s: %s\n", what, strerror(errno));
		return -1;
	}
	if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
		fclose(f);
		fprintf(err, "kvpoold: %s: not a regular file\n", what);
		return -1;
	}
	n = fread(buf, 1, CAP + 1, f);
	fclose(f);
	if (n > CAP) {
		fprintf(err, "kvpoold: %s: larger than %d bytes\n", what, CAP);
		return -1;
	}
	rv = kvpd_cfg_take_token(buf, n, what, dst, err);
	memset(buf, 0, sizeof(buf));
	return rv;
}

/* The short form NAME:BLOCKS[:BLOCK_SIZE] (buf is modified): 0 or -1. */
static int
short_form(struct kvpd_pool_config *p, char *buf)
{
	char *save = NULL, *name = strtok_r(buf, ":", &save), *blocks = strtok_r(NULL, ":", &save);
	char *bs = strtok_r(NULL, ":", &save);
	if (name == NULL || blocks == NULL || strtok_r(NULL, ":", &save) != NULL ||
	    kvpd_cfg_copy_str(p->name, sizeof(p->name), name) != 0 ||
	    kvpd_cfg_parse_u32(blocks, 1, (1u << 30), &p->num_blocks) != 0 ||
	    (bs && kvpd_cfg_parse_u32(bs, 1, 1u << 16, &p->block_size) != 0))
		return -1;
	if (bs == NULL)
		p->block_size = 16;
	return 0;
}

int
kvpd_cfg_exec_item(struct kvpd_exec_settings *e, const char *k, const char *v)
{
	if (strcmp(k, "executor") == 0)
		return kvpd_cfg_copy_str(e->backend, sizeof(e->backend), v);
	if (strcmp(k, "device") == 0)
		return kvpd_cfg_parse_u32(v, 0, 1024, (uint32_t *)&e->device);
	if (strcmp(k, "layers") == 0)
		return kvpd_cfg_parse_u32(v, 1, KVP_KV_MAX_LAYERS, &e->layers);
	if (strcmp(k, "heads") == 0)
		return kvpd_cfg_parse_u32(v, 1, KVP_KV_MAX_HEADS, &e->heads);
	if (strcmp(k, "head_size") == 0)
		return kvpd_cfg_parse_u32(v, 1, KVP_KV_MAX_HEAD_SIZE, &e->head_size);
	if (strcmp(k, "dtype") == 0)
		return kvpd_cfg_copy_str(e->dtype, sizeof(e->dtype), v);
	if (strcmp(k, "layout") == 0)
		return kvpd_cfg_copy_str(e->layout, sizeof(e->layout), v);
	if (strcmp(k, "memory") == 0)
		return kvpd_cfg_copy_str(e->memory, sizeof(e->memory), v);
	return -2;
}

/*
 * One key=value item: 0, -1 bad (the caller names the spec), -2 bad and
 * already explained.
 */
static int
pool_item(struct kvpd_pool_config *p, const char *k, const char *v, FILE *err)
{
	if (strcmp(k, "name") == 0)
		return kvpd_cfg_copy_str(p->name, sizeof(p->name), v);
	if (strcmp(k, "blocks") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 30, &p->num_blocks);
	if (strcmp(k, "block_size") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 16, &p->block_size);
	if (strcmp(k, "hash_block_size") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 16, &p->hash_block_size);
	if (strcmp(k, "caching") == 0)
		return kvpd_cfg_parse_bool(v, &p->caching);
	if (strcmp(k, "groups") == 0)
		return kvpd_cfg_parse_groups(p, v, err) != 0 ? -2 : 0;
	if (strcmp(k, "max_model_len") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 24, &p->max_model_len);
	if (strcmp(k, "seed") == 0) {
		p->has_seed = true;
		return kvpd_cfg_copy_str(p->seed, sizeof(p->seed), v);
	}
	if (strcmp(k, "vllm") == 0)
		return kvp_vllm_semantics_parse(v, &p->vllm) == KVP_OK ? 0 : -1;
	if (strcmp(k, "hash_algo") == 0)
		return kvp_hash_algo_parse(v, &p->hash_algo) == KVP_OK ? 0 : -1;
	if (strcmp(k, "token_file") == 0)
		return kvpd_cfg_read_token(v, p->token, err);
	if (strcmp(k, "medium") == 0)
		return kvpd_cfg_copy_str(p->medium, sizeof(p->medium), v);
	if (strcmp(k, "dp_rank") == 0)
		return kvpd_cfg_parse_u32(v, 0, 1024, (uint32_t *)&p->dp_rank);
	if (strcmp(k, "model") == 0)
		return kvpd_cfg_copy_str(p->model, sizeof(p->model), v);
	if (strcmp(k, "shards") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1024, &p->shards);
	if (strcmp(k, "session_refs") == 0)
		return kvpd_cfg_parse_u32(v, 0, 1u << 30, &p->session_refs);
	if (strcmp(k, "session_rows") == 0)
		return kvpd_cfg_parse_u32(v, 0, 1u << 30, &p->session_rows);
	if (strcmp(k, "cluster_wait_ms") == 0)
		return kvpd_cfg_parse_u32(v, 0, 60000, &p->cluster_wait_ms);
	if (strcmp(k, "cluster_miss_ms") == 0)
		return kvpd_cfg_parse_u32(v, 0, 3600000, &p->cluster_miss_ms);
	if (strcmp(k, "cluster_wants") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 20, &p->cluster_wants);
	if (strcmp(k, "disk") == 0)
		return v[0] == '/' ? kvpd_cfg_copy_str(p->disk, sizeof(p->disk), v) : -1;
	if (strcmp(k, "disk_rows") == 0)
		return kvpd_cfg_parse_u32(v, 1, 1u << 30, &p->disk_rows);
	if (strcmp(k, "restart") == 0) {
		bool warm = strcmp(v, "warm") == 0;
		if (!warm && strcmp(v, "cold") != 0)
			return -1;
		p->restart_warm = warm;
		return 0;
	}
	if (strcmp(k, "clear") == 0) {
		bool alloc = strcmp(v, "alloc") == 0;
		if (!alloc && strcmp(v, "none") != 0)
			return -1;
		p->clear_on_alloc = alloc;
		return 0;
	}
	int rv = kvpd_cfg_exec_item(&p->exec, k, v);
	return rv == -2 ? -1 : rv;
}

int
kvpd_cfg_parse_pool(const char *spec, struct kvpd_pool_config *out, FILE *err)
{
	struct kvpd_pool_config p;
	char buf[2048], *save = NULL;
	int rv = 0;

	memset(&p, 0, sizeof(p));
	p.exec.device = -1;
	p.dp_rank = -1;
	p.max_model_len = 8192;
	p.caching = true;
	p.hash_algo = KVP_HASH_SHA256; /* vLLM's default */
	p.cluster_miss_ms = 1000;
	p.cluster_wants = 4096;
	if (kvpd_cfg_copy_str(buf, sizeof(buf), spec) != 0)
		rv = -1;
	else if (strchr(buf, '=') == NULL)
		rv = short_form(&p, buf);
	else
		for (char *t = strtok_r(buf, ",", &save); t && rv == 0; t = strtok_r(NULL, ",", &save)) {
			char *eq = strchr(t, '=');
			if (eq == NULL) {
				rv = -1;
				break;
			}
			*eq = '\0';
			rv = pool_item(&p, t, eq + 1, err);
		}
	if (rv == -2)
		return -1;
	if (rv == 0 && p.name[0] == '\0')
		rv = -1;
	for (const char *q = p.name; rv == 0 && *q; q++)
		if (!isalnum((unsigned char)*q) && *q != '-' && *q != '_' && *q != '.')
			rv = -1;
	if (rv != 0) {
		fprintf(err, "kvpoold: bad pool spec '%s' (see --help)\n", spec);
		return -1;
	}
	*out = p;
	return 0;
}

const char *
kvpd_pool_seed(const struct kvpd_pool_config *p)
{
	if (p->has_seed)
		return p->seed;
	if (p->vllm != KVP_VLLM_0_33)
		return NULL;
	return p->hash_algo == KVP_HASH_SHA256 || p->hash_algo == KVP_HASH_SHA256_CBOR
	           ? KVPD_DEFAULT_NONE_HASH_SEED
	           : NULL;
}

int
kvpd_cfg_parse_groups(struct kvpd_pool_config *p, const char *v, FILE *err)
{
	char why[200];
	size_t n = 0;

	if (kvp_group_specs_parse(v, p->groups, KVP_MAX_GROUPS, &n, why, sizeof(why)) != KVP_OK) {
		fprintf(err, "kvpoold: pool %s: groups=%s: %s\n", p->name[0] ? p->name : "(unnamed)",
		        v ? v : "", why);
		return -1;
	}
	p->num_groups = (uint32_t)n;
	return 0;
}

int
kvpd_cfg_resolve_groups(struct kvpd_pool_config *p, FILE *err)
{
	char why[200];

	if (p->num_groups == 0) {
		if (p->block_size == 0)
			p->block_size = 16;
		p->groups[0] = (struct kvp_group_spec){.kind = KVP_GROUP_FULL,
		                                       .block_size = p->block_size};
		p->num_groups = 1;
	}
	uint32_t largest = 0;
	for (uint32_t i = 0; i < p->num_groups; i++)
		if (p->groups[i].block_size > largest)
			largest = p->groups[i].block_size;
	/* The executor's blocks hold the largest group's tokens. */
	if (p->block_size == 0)
		p->block_size = largest;
	if (p->hash_block_size == 0)
		p->hash_block_size = kvp_group_specs_hash_block_size(p->groups, p->num_groups);
	kvp_group_specs_resolve(p->groups, p->num_groups, p->caching);
	if (kvp_group_specs_validate(p->groups, p->num_groups, p->hash_block_size, p->caching, why,
	                             sizeof(why)) != KVP_OK) {
		fprintf(err, "kvpoold: pool %s: %s\n", p->name, why);
		return -1;
	}
	for (uint32_t i = 0; p->caching && i < p->num_groups; i++)
		if (p->groups[i].block_size / p->hash_block_size > 32) {
			fprintf(err, "kvpoold: pool %s: group %u's block size is %u hash blocks; at "
			             "most 32 (a coarse hash joins at most 32 fine hashes)\n",
			        p->name, i, p->groups[i].block_size / p->hash_block_size);
			return -1;
		}
	if (p->block_size < largest) {
		fprintf(err, "kvpoold: pool %s: block_size %u is smaller than a group's block size "
		             "(%u); the executor's blocks must hold every group's\n",
		        p->name, p->block_size, largest);
		return -1;
	}
	return 0;
}
