/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoolctl: a command-line client for kvpoold. See `kvpoolctl --help`.
 *
 * Each invocation is one session unless --session resumes a kept one:
 * `kvpoolctl session` opens a session and prints its id without ending it,
 * so later commands can hold blocks across invocations until `end` (or the
 * lease) releases them. --json prints one JSON object per command.
 */
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/kvpool.h"
#include "common/kvp_version.h"
#include "clients/c/subscriber.h"
#include "clients/c/vllm_watch.h"

static void
usage(FILE *out)
{
	fprintf(out,
	        "usage: kvpoolctl [options] COMMAND [args]\n\n"
	        "commands:\n"
	        "  info                      the pool's description (Hello)\n"
	        "  stats                     the pool's counters\n"
	        "  session                   open a session, print its id, keep it (see --session)\n"
	        "  end                       end the --session (its blocks are released)\n"
	        "  alloc N                   allocate N blocks\n"
	        "  free ID...                free blocks, first evicted first\n"
	        "  touch ID...               take one more reference on each block\n"
	        "  evict ID...               drop the blocks' cached hashes\n"
	        "  reset                     clear the prefix cache (fails while blocks are in use)\n"
	        "  cache --blocks IDS --tokens TOKENS [--num-cached N]\n"
	        "                            cache the full blocks of TOKENS in IDS (hashed by the daemon)\n"
	        "  lookup --tokens TOKENS    the longest cached prefix of TOKENS\n"
	        "  snapshot                  every cached (hash, group) and its block count\n"
	        "  read --blocks IDS --out FILE\n"
	        "                            save the blocks' contents (held or cached) to FILE,\n"
	        "                            checksums verified; `info` shows the payload format\n"
	        "  write --blocks IDS --in FILE\n"
	        "                            load FILE (blocks x block_bytes) into blocks this\n"
	        "                            session holds (use --session)\n"
	        "  copy --blocks SRC --to DST  copy block contents (copy-on-write)\n"
	        "  events [--follow] [--events-url URL] [--count N]\n"
	        "                            print events as one JSON object per line (with\n"
	        "                            pool, epoch, seq); --follow keeps going (Ctrl-C stops)\n"
	        "  vllm-events [--vllm-url URL] [--replay-url URL] [--topic PREFIX] [--bind]\n"
	        "              [--from SEQ] [--follow] [--count N]\n"
	        "                            follow vLLM's ZMQ event wire (kvpoold --vllm-events,\n"
	        "                            or vLLM itself): one JSON line per batch {topic, seq,\n"
	        "                            batch}; gaps repaired through --replay-url. Default\n"
	        "                            URL tcp://127.0.0.1:5557 [KVPOOL_VLLM_URL]\n\n"
	        "options (environment in brackets):\n"
	        "  --url URL          daemon endpoint [KVPOOL_URL] (default ipc:///tmp/kvpool.ipc)\n"
	        "  --events-url URL   its event stream [KVPOOL_EVENTS_URL] (default ipc:///tmp/kvpool-events.ipc)\n"
	        "  --pool NAME        pool [KVPOOLCTL_POOL] (default \"default\")\n"
	        "  --token TOKEN, --token-file PATH   auth token [KVPOOL_TOKEN]\n"
	        "  --session ID       resume a session from `kvpoolctl session`\n"
	        "  --lease-ms MS      lease for a new session\n"
	        "  --timeout-ms MS    per attempt (default 5000)\n"
	        "  --tls-ca PATH, --tls-cert PATH, --tls-key PATH, --tls-server-name NAME\n"
	        "  --lora NAME, --salt SALT   extra keys for cache and lookup\n"
	        "  --json             print JSON\n"
	        "  -h, --help         this help (also: kvpoolctl help); nothing is dialed\n"
	        "  --version          the version and the commit it was built from\n"
	        "IDS and TOKENS are comma-separated integers; a-b ranges are allowed.\n");
}

static int
parse_i64_list(const char *s, int64_t **out, size_t *n)
{
	size_t cap = 16;
	int64_t *v = malloc(cap * sizeof(*v));
	char *end;

	*n = 0;
	if (v == NULL)
		return -1;
	while (*s) {
		errno = 0;
		long long a = strtoll(s, &end, 10), b;
		if (end == s || errno)
			goto bad;
		b = a;
		s = end;
		if (*s == '-' && isdigit((unsigned char)s[1])) {
			b = strtoll(s + 1, &end, 10);
			s = end;
			if (b < a || b - a > 10000000)
				goto bad;
		}
		for (long long x = a; x <= b; x++) {
			if (*n == cap) {
				cap *= 2;
				int64_t *nv = realloc(v, cap * sizeof(*v));
				if (nv == NULL)
					goto bad;
				v = nv;
			}
			v[(*n)++] = x;
		}
		if (*s == ',')
			s++;
		else if (*s)
			goto bad;
	}
	*out = v;
	return 0;
bad:
	free(v);
	return -1;
}

static int32_t *
to_ids(const int64_t *v, size_t n)
{
	int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
	for (size_t i = 0; ids && i < n; i++)
		ids[i] = v[i] < INT32_MIN || v[i] > INT32_MAX ? -1 : (int32_t)v[i];
	return ids;
}

static cJSON *
ids_json(const int32_t *ids, size_t n)
{
	cJSON *a = cJSON_CreateArray();
	for (size_t i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
	return a;
}

static void
print_ids(const char *label, const int32_t *ids, size_t n)
{
	printf("%s", label);
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	printf("\n");
}

static char *
read_token_file(const char *path)
{
	static char buf[512];
	FILE *f = fopen(path, "r");
	size_t n;
	if (f == NULL)
		return NULL;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		buf[--n] = '\0';
	return buf;
}

/* ---- events ---- */

struct follow {
	const char *pool;
	unsigned long printed, max;
};

static void
hex_into(char *dst, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		snprintf(dst + 2 * i, 3, "%02x", b[i]);
	dst[2 * n] = '\0';
}

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
		hex_into(buf, p, ev->hash_len);
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
			hex_into(buf, ev->parent, ev->hash_len);
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
				hex_into(buf, ev->extra_keys + a, b - a);
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

static int
follow_events(const struct kvp_client_options *o, const char *events_url, bool follow,
              unsigned long max)
{
	struct follow f = {.pool = o->pool, .max = max};
	struct kvp_sub_options so = {.events_url = events_url, .rpc_url = o->url, .pool = o->pool,
	                             .token = o->token, .timeout_ms = o->timeout_ms,
	                             .tls_ca_file = o->tls_ca_file, .tls_cert_file = o->tls_cert_file,
	                             .tls_key_file = o->tls_key_file,
	                             .tls_server_name = o->tls_server_name};
	struct kvp_sub_handler h = {.ctx = &f, .reset = on_reset, .batch = on_events};
	struct kvp_sub *sub = NULL;
	int rv = kvp_sub_open(&so, &h, &sub);

	if (rv != KVP_OK) {
		fprintf(stderr, "kvpoolctl: cannot follow %s (pool %s): %s\n", events_url, o->pool,
		        kvp_strerror(rv));
		return 1;
	}
	/* Without --follow: what arrives within a second. */
	for (int rounds = 0; follow || rounds < 10; rounds++) {
		if ((rv = kvp_sub_poll(sub, 100)) != KVP_OK)
			fprintf(stderr, "kvpoolctl: %s: %s\n", kvp_strerror(rv), kvp_sub_last_detail(sub));
		if (max && f.printed >= max)
			break;
	}
	kvp_sub_close(sub);
	return 0;
}

/* Reads a whole file into a new buffer. NULL (errno set) on failure. */
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

/* read / write / copy: block contents to and from files. */
static int
data_command(struct kvp_client *c, const char *cmd, const char *blocks_arg, const char *to_arg,
             const char *in_path, const char *out_path, bool json, cJSON *j)
{
	uint64_t bb = kvp_client_info(c)->executor.block_bytes;
	int64_t *vals = NULL, *dvals = NULL;
	size_t n = 0, nd = 0, len = 0;
	unsigned char *buf = NULL;
	int32_t *ids = NULL, *dst = NULL;
	uint32_t *crcs = NULL;
	int rv = KVP_EINVAL;

	if (blocks_arg == NULL || parse_i64_list(blocks_arg, &vals, &n) != 0 || n == 0) {
		fprintf(stderr, "kvpoolctl: %s needs --blocks IDS\n", cmd);
		return KVP_EINVAL;
	}
	ids = to_ids(vals, n);
	if (bb == 0) {
		fprintf(stderr, "kvpoolctl: pool %s has no executor: it keeps no block contents\n",
		        kvp_client_info(c)->pool);
		rv = KVP_ENOTSUP;
		goto out;
	}
	if (strcmp(cmd, "copy") == 0) {
		if (to_arg == NULL || parse_i64_list(to_arg, &dvals, &nd) != 0 || nd != n) {
			fprintf(stderr, "kvpoolctl: copy needs --to with as many ids as --blocks\n");
			goto out;
		}
		dst = to_ids(dvals, nd);
		if ((rv = kvp_client_copy_blocks(c, ids, dst, n)) == KVP_OK && !json)
			printf("copied %zu block(s)\n", n);
	} else if (strcmp(cmd, "read") == 0) {
		FILE *f;
		if (out_path == NULL) {
			fprintf(stderr, "kvpoolctl: read needs --out FILE\n");
			goto out;
		}
		if ((buf = malloc(n * bb)) == NULL || (crcs = malloc(n * sizeof(*crcs))) == NULL) {
			rv = KVP_ENOMEM;
			goto out;
		}
		if ((rv = kvp_client_read_blocks(c, ids, n, buf, n * bb, crcs)) != KVP_OK)
			goto out;
		if ((f = fopen(out_path, "wb")) == NULL || fwrite(buf, 1, n * bb, f) != n * bb ||
		    fclose(f) != 0) {
			fprintf(stderr, "kvpoolctl: cannot write %s: %s\n", out_path, strerror(errno));
			rv = KVP_EINTERNAL;
			goto out;
		}
		cJSON *arr = cJSON_AddArrayToObject(j, "crc32c");
		for (size_t i = 0; i < n; i++) {
			char h[9];
			snprintf(h, sizeof(h), "%08x", crcs[i]);
			cJSON_AddItemToArray(arr, cJSON_CreateString(h));
		}
		cJSON_AddNumberToObject(j, "bytes", (double)(n * bb));
		if (!json)
			printf("read %zu block(s), %" PRIu64 " bytes, checksums verified, to %s\n", n,
			       (uint64_t)(n * bb), out_path);
	} else {
		if (in_path == NULL) {
			fprintf(stderr, "kvpoolctl: write needs --in FILE\n");
			goto out;
		}
		if ((buf = slurp(in_path, &len)) == NULL) {
			fprintf(stderr, "kvpoolctl: cannot read %s: %s\n", in_path, strerror(errno));
			goto out;
		}
		if (len != n * bb) {
			fprintf(stderr, "kvpoolctl: %s has %zu bytes; %zu block(s) take %" PRIu64 "\n",
			        in_path, len, n, (uint64_t)(n * bb));
			goto out;
		}
		if ((rv = kvp_client_write_blocks(c, ids, n, buf, len)) == KVP_OK && !json)
			printf("wrote %zu block(s), %zu bytes\n", n, len);
	}
	if (rv == KVP_OK)
		cJSON_AddItemToObject(j, "block_ids", ids_json(ids, n));
out:
	free(vals);
	free(dvals);
	free(ids);
	free(dst);
	free(buf);
	free(crcs);
	return rv;
}

/* A whole non-negative decimal number, or -1. */
static int
parse_u64(const char *s, uint64_t *out)
{
	char *end;
	if (s == NULL || s[0] < '0' || s[0] > '9')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = v;
	return 0;
}

/* `vllm-events`: its own options, checked before anything is dialed. */
static int
vllm_events(int argc, char **argv, int first, uint32_t timeout_ms)
{
	struct kvp_vllm_watch_options w = {
		.url = getenv("KVPOOL_VLLM_URL") ? getenv("KVPOOL_VLLM_URL") : "tcp://127.0.0.1:5557",
		.topic = "",
		.timeout_ms = timeout_ms ? (int)timeout_ms : 5000,
	};
	for (int k = first; k < argc; k++) {
		const char *a = argv[k], *v = k + 1 < argc ? argv[k + 1] : NULL;
		uint64_t n;
		if (strcmp(a, "--vllm-url") == 0 && v)
			w.url = argv[++k];
		else if (strcmp(a, "--replay-url") == 0 && v)
			w.replay_url = argv[++k];
		else if (strcmp(a, "--topic") == 0 && v)
			w.topic = argv[++k];
		else if (strcmp(a, "--bind") == 0)
			w.bind = true;
		else if (strcmp(a, "--follow") == 0)
			w.follow = true;
		else if (strcmp(a, "--from") == 0 && parse_u64(v, &n) == 0)
			w.from = n, w.has_from = true, k++;
		else if (strcmp(a, "--count") == 0 && parse_u64(v, &n) == 0 && n <= ULONG_MAX)
			w.max = (unsigned long)n, k++;
		else {
			fprintf(stderr, "kvpoolctl: vllm-events: bad or incomplete option %s\n", a);
			return 2;
		}
	}
	if (w.has_from && w.replay_url == NULL) {
		fprintf(stderr, "kvpoolctl: vllm-events: --from needs --replay-url\n");
		return 2;
	}
	return kvp_vllm_watch(&w);
}

int
main(int argc, char **argv)
{
	struct kvp_client_options o = {0};
	struct kvp_client *c = NULL;
	const char *blocks_arg = NULL, *tokens_arg = NULL, *lora = NULL, *salt = NULL;
	const char *in_path = NULL, *out_path = NULL, *to_arg = NULL;
	uint32_t num_cached = 0;
	bool json = false, keep = false, follow = false;
	const char *events_url = getenv("KVPOOL_EVENTS_URL") ? getenv("KVPOOL_EVENTS_URL")
	                                                     : "ipc:///tmp/kvpool-events.ipc";
	unsigned long max_events = 0;
	int i, rv;

	o.url = getenv("KVPOOL_URL") ? getenv("KVPOOL_URL") : "ipc:///tmp/kvpool.ipc";
	o.pool = getenv("KVPOOLCTL_POOL") ? getenv("KVPOOLCTL_POOL") : "default";
	o.token = getenv("KVPOOL_TOKEN");
	o.client_name = "kvpoolctl";
	for (i = 1; i < argc && (strncmp(argv[i], "--", 2) == 0 || strcmp(argv[i], "-h") == 0); i++) {
		const char *a = argv[i];
#define ARG(name) (strcmp(a, name) == 0 && i + 1 < argc)
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(a, "--version") == 0) {
			printf("kvpoolctl %s (commit %s)\n", KVP_VERSION, KVP_GIT_COMMIT);
			return 0;
		} else if (strcmp(a, "--json") == 0) {
			json = true;
		} else if (ARG("--url")) {
			o.url = argv[++i];
		} else if (ARG("--pool")) {
			o.pool = argv[++i];
		} else if (ARG("--token")) {
			o.token = argv[++i];
		} else if (ARG("--token-file")) {
			if ((o.token = read_token_file(argv[++i])) == NULL) {
				fprintf(stderr, "kvpoolctl: cannot read %s\n", argv[i]);
				return 2;
			}
		} else if (ARG("--session")) {
			o.session_id = strtoull(argv[++i], NULL, 10);
		} else if (ARG("--lease-ms")) {
			o.lease_ms = (uint32_t)strtoul(argv[++i], NULL, 10);
		} else if (ARG("--timeout-ms")) {
			o.timeout_ms = (uint32_t)strtoul(argv[++i], NULL, 10);
		} else if (ARG("--tls-ca")) {
			o.tls_ca_file = argv[++i];
		} else if (ARG("--tls-cert")) {
			o.tls_cert_file = argv[++i];
		} else if (ARG("--tls-key")) {
			o.tls_key_file = argv[++i];
		} else if (ARG("--tls-server-name")) {
			o.tls_server_name = argv[++i];
		} else if (ARG("--lora")) {
			lora = argv[++i];
		} else if (ARG("--salt")) {
			salt = argv[++i];
		} else {
			fprintf(stderr, "kvpoolctl: unknown or incomplete option %s\n", a);
			usage(stderr);
			return 2;
		}
#undef ARG
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[i++];
	if (strcmp(cmd, "help") == 0) { /* usage, without dialing the daemon */
		usage(stdout);
		return 0;
	}
	/* Command options after the command name. */
	int first_arg = i;
	for (int k = i; k < argc; k++) {
		if (strcmp(argv[k], "--blocks") == 0 && k + 1 < argc)
			blocks_arg = argv[++k];
		else if (strcmp(argv[k], "--tokens") == 0 && k + 1 < argc)
			tokens_arg = argv[++k];
		else if (strcmp(argv[k], "--num-cached") == 0 && k + 1 < argc)
			num_cached = (uint32_t)strtoul(argv[++k], NULL, 10);
		else if (strcmp(argv[k], "--events-url") == 0 && k + 1 < argc)
			events_url = argv[++k];
		else if (strcmp(argv[k], "--count") == 0 && k + 1 < argc)
			max_events = strtoul(argv[++k], NULL, 10);
		else if (strcmp(argv[k], "--follow") == 0)
			follow = true;
		else if (strcmp(argv[k], "--in") == 0 && k + 1 < argc)
			in_path = argv[++k];
		else if (strcmp(argv[k], "--out") == 0 && k + 1 < argc)
			out_path = argv[++k];
		else if (strcmp(argv[k], "--to") == 0 && k + 1 < argc)
			to_arg = argv[++k];
		else if (strcmp(argv[k], "--lora") == 0 && k + 1 < argc)
			lora = argv[++k];
		else if (strcmp(argv[k], "--salt") == 0 && k + 1 < argc)
			salt = argv[++k];
	}
	/* Ids: the remaining words, joined. */
	int64_t *vals = NULL;
	size_t nvals = 0;
	if (strcmp(cmd, "free") == 0 || strcmp(cmd, "touch") == 0 || strcmp(cmd, "evict") == 0) {
		char joined[65536] = "";
		for (int k = first_arg; k < argc; k++) {
			strncat(joined, argv[k], sizeof(joined) - strlen(joined) - 2);
			if (k + 1 < argc)
				strcat(joined, ",");
		}
		if (first_arg >= argc || parse_i64_list(joined, &vals, &nvals) != 0) {
			fprintf(stderr, "kvpoolctl: %s needs block ids\n", cmd);
			return 2;
		}
	}
	if (strcmp(cmd, "session") == 0)
		keep = true;
	if (strcmp(cmd, "end") == 0 && o.session_id == 0) {
		fprintf(stderr, "kvpoolctl: end needs --session ID\n");
		return 2;
	}

	if (strcmp(cmd, "events") == 0)
		return follow_events(&o, events_url, follow, max_events);
	if (strcmp(cmd, "vllm-events") == 0)
		return vllm_events(argc, argv, first_arg, o.timeout_ms);

	if ((rv = kvp_client_open(&o, &c)) != KVP_OK) {
		fprintf(stderr, "kvpoolctl: %s on %s pool %s: %s%s%s\n", kvp_status_name(rv), o.url,
		        o.pool, kvp_strerror(rv), c ? ": " : "", c ? kvp_client_last_detail(c) : "");
		return 1;
	}
	keep = keep || o.session_id != 0;
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "command", cmd);
	rv = KVP_OK;
	struct kvp_request_keys keys = {.lora_name = lora, .cache_salt = salt};
	const struct kvp_request_keys *kp = lora || salt ? &keys : NULL;

	if (strcmp(cmd, "info") == 0 || strcmp(cmd, "session") == 0) {
		const struct kvp_client_info *in = kvp_client_info(c);
		char fp[17];
		for (int k = 0; k < 8; k++)
			snprintf(fp + 2 * k, 3, "%02x", in->none_hash_fingerprint[k]);
		cJSON_AddStringToObject(j, "pool", in->pool);
		char sid[24];
		snprintf(sid, sizeof(sid), "%" PRIu64, in->session_id);
		cJSON_AddStringToObject(j, "session_id", sid); /* 64 bits: not a JSON double */
		cJSON_AddNumberToObject(j, "lease_ms", in->lease_ms);
		cJSON_AddNumberToObject(j, "num_blocks", in->num_blocks);
		cJSON_AddNumberToObject(j, "block_size", in->block_size);
		cJSON_AddNumberToObject(j, "hash_block_size", in->hash_block_size);
		cJSON_AddStringToObject(j, "hash_algorithm", in->hash_algorithm);
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
				cJSON_AddStringToObject(go, "mamba_cache_mode",
				                        kvp_mamba_mode_name(s->mamba_mode));
			cJSON_AddItemToArray(ga, go);
		}
		cJSON_AddStringToObject(j, "none_hash_fingerprint", fp);
		cJSON_AddStringToObject(j, "medium", in->medium);
		cJSON_AddNumberToObject(j, "max_model_len", in->max_model_len);
		cJSON_AddNumberToObject(j, "max_ids_per_call", in->max_ids_per_call);
		cJSON_AddNumberToObject(j, "max_msg_bytes", in->max_msg_bytes);
		if (in->server_version[0])
			cJSON_AddStringToObject(j, "server_version", in->server_version);
		const struct kvp_client_executor *x = &in->executor;
		if (x->backend[0]) {
			cJSON *e = cJSON_AddObjectToObject(j, "executor");
			cJSON_AddStringToObject(e, "backend", x->backend);
			cJSON_AddNumberToObject(e, "num_layers", x->num_layers);
			cJSON_AddNumberToObject(e, "num_heads", x->num_heads);
			cJSON_AddNumberToObject(e, "head_size", x->head_size);
			cJSON_AddStringToObject(e, "dtype", x->dtype);
			cJSON_AddStringToObject(e, "layout", x->layout);
			cJSON_AddNumberToObject(e, "block_bytes", (double)x->block_bytes);
			cJSON_AddNumberToObject(e, "memory_bytes", (double)x->memory_bytes);
		}
		if (!json && strcmp(cmd, "info") == 0 && x->backend[0])
			printf("executor %s: %u layers x K,V x [%u tokens, %u heads, %u] %s (%s), "
			       "%" PRIu64 " bytes a block, %" PRIu64 " MiB in all\n",
			       x->backend, x->num_layers, x->block_size, x->num_heads, x->head_size,
			       x->dtype, x->layout, x->block_bytes, x->memory_bytes >> 20);
		else if (!json && strcmp(cmd, "info") == 0)
			printf("executor: none (the pool keeps no block contents)\n");
		if (!json) {
			if (strcmp(cmd, "session") == 0)
				printf("%" PRIu64 "\n", in->session_id);
			else
				printf("pool %s: %u blocks of %u tokens, %s (NONE_HASH fingerprint %s), "
				       "medium %s, max_model_len %u, %u ids per call\n",
				       in->pool, in->num_blocks, in->block_size, in->hash_algorithm, fp,
				       in->medium, in->max_model_len, in->max_ids_per_call);
			if (strcmp(cmd, "info") == 0) {
				char groups[256];
				if (kvp_group_specs_format(in->groups, in->num_groups, groups,
				                           sizeof(groups)) != KVP_OK)
					snprintf(groups, sizeof(groups), "(%u groups)", in->num_groups);
				printf("groups %s (hash block size %u), prefix caching %s\n", groups,
				       in->hash_block_size, in->prefix_caching ? "on" : "off");
			}
			if (strcmp(cmd, "info") == 0 && in->server_version[0])
				printf("kvpoold %s\n", in->server_version);
		}
	} else if (strcmp(cmd, "stats") == 0) {
		struct kvp_client_stats s;
		if ((rv = kvp_client_stats(c, &s)) == KVP_OK) {
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
			if (!json)
				printf("blocks %u, free %u, cached %u (%u keys), usage %.1f%%\n"
				       "allocated %" PRIu64 ", evicted %" PRIu64 ", failed allocations %" PRIu64
				       "\nprefix cache: %" PRIu64 " of %" PRIu64 " tokens hit\n"
				       "sessions %u, leases expired %" PRIu64 ", events %" PRIu64
				       ", requests %u\n",
				       s.num_blocks, s.num_free, s.num_cached_blocks, s.num_cached_keys,
				       s.usage * 100.0, s.blocks_allocated, s.blocks_evicted, s.alloc_failures,
				       s.prefix_hits, s.prefix_queries, s.sessions, s.leases_expired,
				       s.events_emitted, s.active_requests);
		}
	} else if (strcmp(cmd, "end") == 0) {
		kvp_client_close(c); /* Goodbye */
		c = NULL;
		if (!json)
			printf("session %" PRIu64 " ended\n", o.session_id);
	} else if (strcmp(cmd, "alloc") == 0) {
		uint32_t n = first_arg < argc ? (uint32_t)strtoul(argv[first_arg], NULL, 10) : 0;
		int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
		if (ids == NULL || n == 0) {
			fprintf(stderr, "kvpoolctl: alloc needs a count\n");
			rv = KVP_EINVAL;
		} else if ((rv = kvp_client_allocate(c, n, ids)) == KVP_OK) {
			cJSON_AddItemToObject(j, "block_ids", ids_json(ids, n));
			if (!json)
				print_ids("", ids, n);
			if (!keep)
				fprintf(stderr, "kvpoolctl: note: these blocks are released when this "
				                "session ends; use `kvpoolctl session` and --session to keep them\n");
		}
		free(ids);
	} else if (strcmp(cmd, "free") == 0 || strcmp(cmd, "touch") == 0 ||
	           strcmp(cmd, "evict") == 0) {
		int32_t *ids = to_ids(vals, nvals);
		uint32_t evicted = 0;
		if (cmd[0] == 'f')
			rv = kvp_client_free(c, ids, nvals);
		else if (cmd[0] == 't')
			rv = kvp_client_touch(c, ids, nvals);
		else
			rv = kvp_client_evict(c, ids, nvals, &evicted);
		if (rv == KVP_OK) {
			cJSON_AddItemToObject(j, "block_ids", ids_json(ids, nvals));
			if (cmd[0] == 'e')
				cJSON_AddNumberToObject(j, "num_evicted", evicted);
			if (!json)
				printf("ok%s\n", cmd[0] == 'e' ? "" : "");
		}
		free(ids);
	} else if (strcmp(cmd, "read") == 0 || strcmp(cmd, "write") == 0 ||
	           strcmp(cmd, "copy") == 0) {
		rv = data_command(c, cmd, blocks_arg, to_arg, in_path, out_path, json, j);
	} else if (strcmp(cmd, "snapshot") == 0) {
		struct kvp_snapshot *snap = NULL;
		if ((rv = kvp_client_snapshot(c, &snap)) == KVP_OK) {
			cJSON *arr = cJSON_CreateArray();
			char ep[24];
			snprintf(ep, sizeof(ep), "%" PRIu64, snap->epoch);
			cJSON_AddStringToObject(j, "epoch", ep);
			cJSON_AddNumberToObject(j, "next_seq", (double)snap->next_seq);
			for (size_t k = 0; k < snap->num_entries; k++) {
				const struct kvp_snapshot_entry *e = &snap->entries[k];
				cJSON *x = cJSON_CreateObject();
				char hex[2 * 1024 + 1];
				for (size_t b = 0; b < e->hash_len && b < 1024; b++)
					snprintf(hex + 2 * b, 3, "%02x", e->hash[b]);
				hex[2 * (e->hash_len < 1024 ? e->hash_len : 1024)] = '\0';
				cJSON_AddStringToObject(x, "hash", hex);
				cJSON_AddNumberToObject(x, "group", e->group_idx);
				cJSON_AddNumberToObject(x, "blocks", e->num_blocks);
				cJSON_AddItemToArray(arr, x);
				if (!json)
					printf("%s group %u blocks %u\n", hex, e->group_idx, e->num_blocks);
			}
			cJSON_AddItemToObject(j, "entries", arr);
			if (!json)
				printf("%zu cached (hash, group) entries; epoch %" PRIu64 ", next seq %" PRIu64
				       "\n", snap->num_entries, snap->epoch, snap->next_seq);
			kvp_snapshot_free(snap);
		}
	} else if (strcmp(cmd, "reset") == 0) {
		if ((rv = kvp_client_reset(c)) == KVP_OK && !json)
			printf("prefix cache cleared\n");
	} else if (strcmp(cmd, "cache") == 0 || strcmp(cmd, "lookup") == 0) {
		int64_t *tok = NULL, *bl = NULL;
		size_t ntok = 0, nbl = 0;
		if (tokens_arg == NULL || parse_i64_list(tokens_arg, &tok, &ntok) != 0 ||
		    (cmd[0] == 'c' && (blocks_arg == NULL || parse_i64_list(blocks_arg, &bl, &nbl) != 0))) {
			fprintf(stderr, "kvpoolctl: %s needs --tokens%s\n", cmd,
			        cmd[0] == 'c' ? " and --blocks" : "");
			rv = KVP_EINVAL;
		} else if (cmd[0] == 'c') {
			int32_t *ids = to_ids(bl, nbl);
			uint32_t bs = kvp_client_info(c)->block_size;
			if (bs == 0) {
				/* A resumed session skipped Hello: ask a short-lived one. */
				struct kvp_client_options oo = o;
				struct kvp_client *tmp = NULL;
				oo.session_id = 0;
				if (kvp_client_open(&oo, &tmp) == KVP_OK)
					bs = kvp_client_info(tmp)->block_size;
				kvp_client_close(tmp);
			}
			if (bs == 0)
				bs = 1;
			uint32_t full = (uint32_t)(ntok / bs);
			if (full > nbl)
				full = (uint32_t)nbl;
			uint32_t stored = 0;
			struct kvp_client_cache a = {.block_ids = ids, .num_block_ids = nbl,
			                             .num_cached_blocks = num_cached, .num_full_blocks = full,
			                             .tokens = tok, .num_tokens = ntok, .keys = kp};
			if ((rv = kvp_client_cache(c, &a, &stored)) == KVP_OK) {
				cJSON_AddNumberToObject(j, "num_stored", stored);
				if (!json)
					printf("%u block(s) cached\n", stored);
			}
			free(ids);
		} else {
			size_t cap = ntok + 1;
			int32_t *hits = malloc(cap * sizeof(*hits));
			uint32_t nh = 0, ht = 0;
			struct kvp_client_lookup q = {.tokens = tok, .num_tokens = ntok, .keys = kp};
			if ((rv = kvp_client_lookup(c, &q, hits, cap, &nh, &ht)) == KVP_OK) {
				cJSON_AddItemToObject(j, "block_ids", ids_json(hits, nh));
				cJSON_AddNumberToObject(j, "hit_tokens", ht);
				if (!json) {
					printf("hit %u tokens in %u block(s): ", ht, nh);
					print_ids("", hits, nh);
				}
			}
			free(hits);
		}
		free(tok);
		free(bl);
	} else {
		fprintf(stderr, "kvpoolctl: unknown command %s\n", cmd);
		usage(stderr);
		cJSON_Delete(j);
		free(vals);
		kvp_client_detach(c);
		return 2;
	}
	cJSON_AddStringToObject(j, "status", kvp_status_name(rv));
	if (rv != KVP_OK) {
		const char *d = c ? kvp_client_last_detail(c) : "";
		cJSON_AddStringToObject(j, "detail", d);
		if (!json)
			fprintf(stderr, "kvpoolctl: %s: %s%s%s\n", kvp_status_name(rv), kvp_strerror(rv),
			        d[0] ? ": " : "", d);
	}
	if (json) {
		char *s = cJSON_PrintUnformatted(j);
		if (s)
			printf("%s\n", s);
		free(s);
	}
	cJSON_Delete(j);
	free(vals);
	if (c) {
		if (keep)
			kvp_client_detach(c);
		else
			kvp_client_close(c);
	}
	return rv == KVP_OK ? 0 : 1;
}
