/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoolctl: a command-line client for kvpoold. See `kvpoolctl --help`.
 *
 * Each invocation is one session unless --session resumes a kept one:
 * `kvpoolctl session` opens a session and prints its id without ending it,
 * so later commands can hold blocks across invocations until `end` (or the
 * lease) releases them. --json prints one JSON object per command, errors
 * included. Every argument is checked before anything is dialed.
 *
 * Exit codes: 0 ok; 1 the daemon refused the call (or the pool cannot do
 * it); 2 usage (a bad option, number or id list); 3 cannot reach the
 * daemon; 4 a local file could not be read or written.
 */
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/kvpool.h"
#include "common/kvp_version.h"
#include "clients/c/subscriber.h"
#include "clients/c/vllm_watch.h"

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
		if (!isdigit((unsigned char)*s)) /* no sign, no space: ids and tokens are >= 0 */
			goto bad;
		long long a = strtoll(s, &end, 10), b;
		if (end == s || errno)
			goto bad;
		b = a;
		s = end;
		if (*s == '-' && isdigit((unsigned char)s[1])) {
			b = strtoll(s + 1, &end, 10);
			s = end;
			if (b < a || b - a > 10000000 || *n + (size_t)(b - a) > (1u << 24))
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

/* ---- the invocation: options, commands, exit codes ---- */

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_LOCAL = 4 };
static const char *const exit_kind[] = {"ok", "refused", "usage", "unreachable", "local"};

struct ctl {
	struct kvp_client_options o;
	const struct command *cmd;
	const char *cmd_name;
	bool json;
	/* command options */
	const char *blocks, *tokens, *to, *in, *out, *events_url, *lora, *salt, *token_file;
	const char *vllm_url, *replay_url, *topic;
	bool follow, bind, help, version;
	uint64_t from;
	bool has_from;
	uint32_t num_cached, count;
	/* positional words after the command */
	char **pos;
	size_t npos;
	/* parsed before dialing */
	int64_t *ids, *toks, *dst;
	size_t nids, ntoks, ndst;
	uint32_t alloc_n;
	struct kvp_request_keys keys;
	/* after dialing */
	struct kvp_client *c;
	cJSON *j;
	int reported;   /* the exit code of the error fail() printed */
};

/* One error, as a line on stderr or, with --json, one object on stdout. Returns code. */
static int __attribute__((format(printf, 4, 5)))
fail(struct ctl *x, int code, int status, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	x->reported = code;
	if (x->json) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "command", x->cmd_name ? x->cmd_name : "");
		cJSON_AddStringToObject(o, "status", kvp_status_name(status));
		cJSON_AddStringToObject(o, "error", exit_kind[code]);
		cJSON_AddNumberToObject(o, "exit_code", code);
		cJSON_AddStringToObject(o, "detail", msg);
		char *s = cJSON_PrintUnformatted(o);
		if (s)
			printf("%s\n", s);
		free(s);
		cJSON_Delete(o);
	} else {
		fprintf(stderr, "kvpoolctl: %s\n", msg);
		if (code == EXIT_USAGE)
			fprintf(stderr, "kvpoolctl: see kvpoolctl --help\n");
	}
	return code;
}

#define usage_error(x, ...) fail((x), EXIT_USAGE, KVP_EINVAL, __VA_ARGS__)

/* The exit code of a status from the library or the daemon. */
static int
exit_of(int status)
{
	return status == KVP_OK ? EXIT_OK : status == KVP_EUNAVAILABLE ? EXIT_UNREACHABLE : EXIT_REFUSED;
}

/* A failed call: the daemon's (or library's) status and detail. */
static int
refused(struct ctl *x, int status, const char *detail)
{
	return fail(x, exit_of(status), status, "%s: %s%s%s", kvp_status_name(status),
	            kvp_strerror(status), detail && detail[0] ? ": " : "", detail ? detail : "");
}

/* Commands, each a bit in the options' `only` masks. */
enum {
	C_INFO = 1u << 0, C_STATS = 1u << 1, C_SESSION = 1u << 2, C_END = 1u << 3,
	C_ALLOC = 1u << 4, C_FREE = 1u << 5, C_TOUCH = 1u << 6, C_EVICT = 1u << 7,
	C_RESET = 1u << 8, C_CACHE = 1u << 9, C_LOOKUP = 1u << 10, C_SNAPSHOT = 1u << 11,
	C_READ = 1u << 12, C_WRITE = 1u << 13, C_COPY = 1u << 14, C_EVENTS = 1u << 15,
	C_VLLM = 1u << 16, C_HELP = 1u << 17,
};

enum opt_kind { O_FLAG, O_STR, O_U32, O_U64 };
static const struct opt {
	const char *name, *arg, *env, *help;
	enum opt_kind kind;
	size_t off;          /* in struct ctl */
	unsigned only;       /* commands that take it; 0: every command */
	uint64_t min, max;   /* numbers */
} opts[] = {
#define F(m) offsetof(struct ctl, m)
	{"--url", "URL", "KVPOOL_URL", "daemon endpoint (default ipc:///tmp/kvpool.ipc)", O_STR,
	 F(o.url), 0, 0, 0},
	{"--pool", "NAME", "KVPOOLCTL_POOL", "pool (default \"default\")", O_STR, F(o.pool), 0, 0, 0},
	{"--token", "TOKEN", "KVPOOL_TOKEN", "the pool's auth token (prefer --token-file)", O_STR,
	 F(o.token), 0, 0, 0},
	{"--token-file", "PATH", NULL, "read the token from a file (trimmed)", O_STR,
	 F(token_file), 0, 0, 0},
	{"--session", "ID", NULL, "resume a session from `kvpoolctl session`", O_U64,
	 F(o.session_id), 0, 1, UINT64_MAX},
	{"--lease-ms", "MS", NULL, "lease for a new session", O_U32, F(o.lease_ms), 0, 1, UINT32_MAX},
	{"--timeout-ms", "MS", NULL, "per attempt (default 5000)", O_U32, F(o.timeout_ms), 0, 1,
	 UINT32_MAX},
	{"--connect-timeout-ms", "MS", "KVPOOL_CONNECT_TIMEOUT_MS",
	 "give up (exit 3) when no daemon answers the dial within this (default 2000)", O_U32,
	 F(o.connect_timeout_ms), 0, 1, UINT32_MAX},
	{"--tls-ca", "PATH", NULL, "CA that signed the daemon's certificate (tls+tcp://)", O_STR,
	 F(o.tls_ca_file), 0, 0, 0},
	{"--tls-cert", "PATH", NULL, "our certificate, for mutual TLS", O_STR, F(o.tls_cert_file), 0,
	 0, 0},
	{"--tls-key", "PATH", NULL, "its key", O_STR, F(o.tls_key_file), 0, 0, 0},
	{"--tls-server-name", "NAME", NULL, "name to verify (default the URL's host)", O_STR,
	 F(o.tls_server_name), 0, 0, 0},
	{"--json", NULL, NULL, "print one JSON object (errors too) or, for events, one per line",
	 O_FLAG, F(json), 0, 0, 0},
	{"--help", NULL, NULL, "this help (also -h, kvpoolctl help); nothing is dialed", O_FLAG,
	 F(help), 0, 0, 0},
	{"--version", NULL, NULL, "the version and the commit it was built from", O_FLAG,
	 F(version), 0, 0, 0},
	{"--blocks", "IDS", NULL, NULL, O_STR, F(blocks), C_CACHE | C_READ | C_WRITE | C_COPY, 0, 0},
	{"--tokens", "TOKENS", NULL, NULL, O_STR, F(tokens), C_CACHE | C_LOOKUP, 0, 0},
	{"--num-cached", "N", NULL, NULL, O_U32, F(num_cached), C_CACHE, 0, UINT32_MAX},
	{"--lora", "NAME", NULL, NULL, O_STR, F(lora), C_CACHE | C_LOOKUP, 0, 0},
	{"--salt", "SALT", NULL, NULL, O_STR, F(salt), C_CACHE | C_LOOKUP, 0, 0},
	{"--to", "IDS", NULL, NULL, O_STR, F(to), C_COPY, 0, 0},
	{"--in", "FILE", NULL, NULL, O_STR, F(in), C_WRITE, 0, 0},
	{"--out", "FILE", NULL, NULL, O_STR, F(out), C_READ, 0, 0},
	{"--events-url", "URL", "KVPOOL_EVENTS_URL", NULL, O_STR, F(events_url), C_EVENTS, 0, 0},
	{"--follow", NULL, NULL, NULL, O_FLAG, F(follow), C_EVENTS | C_VLLM, 0, 0},
	{"--count", "N", NULL, NULL, O_U32, F(count), C_EVENTS | C_VLLM, 1, UINT32_MAX},
	{"--vllm-url", "URL", "KVPOOL_VLLM_URL", NULL, O_STR, F(vllm_url), C_VLLM, 0, 0},
	{"--replay-url", "URL", NULL, NULL, O_STR, F(replay_url), C_VLLM, 0, 0},
	{"--topic", "PREFIX", NULL, NULL, O_STR, F(topic), C_VLLM, 0, 0},
	{"--bind", NULL, NULL, NULL, O_FLAG, F(bind), C_VLLM, 0, 0},
	{"--from", "SEQ", NULL, NULL, O_U64, F(from), C_VLLM, 0, UINT64_MAX},
#undef F
};

struct command {
	const char *name, *args, *help;
	unsigned bit;
	int (*run)(struct ctl *x); /* a kvp status; called with x->c open unless NO_DIAL */
};

static int run_info(struct ctl *x);
static int run_stats(struct ctl *x);
static int run_end(struct ctl *x);
static int run_alloc(struct ctl *x);
static int run_ids(struct ctl *x);
static int run_reset(struct ctl *x);
static int run_cache(struct ctl *x);
static int run_lookup(struct ctl *x);
static int run_snapshot(struct ctl *x);
static int run_data(struct ctl *x);

/* Commands that dial on their own (or not at all) have no run. */
static const struct command commands[] = {
	{"info", "", "the pool's description (Hello)", C_INFO, run_info},
	{"stats", "", "the pool's counters", C_STATS, run_stats},
	{"session", "", "open a session, print its id, keep it (see --session)", C_SESSION, run_info},
	{"end", "", "end the --session (its blocks are released)", C_END, run_end},
	{"alloc", "N", "allocate N blocks", C_ALLOC, run_alloc},
	{"free", "ID...", "free blocks, first evicted first", C_FREE, run_ids},
	{"touch", "ID...", "take one more reference on each block", C_TOUCH, run_ids},
	{"evict", "ID...", "drop the blocks' cached hashes", C_EVICT, run_ids},
	{"reset", "", "clear the prefix cache (fails while blocks are in use)", C_RESET, run_reset},
	{"cache", "--blocks IDS --tokens TOKENS [--num-cached N] [--lora NAME] [--salt SALT]",
	 "cache the full blocks of TOKENS in IDS (hashed by the daemon)", C_CACHE, run_cache},
	{"lookup", "--tokens TOKENS [--lora NAME] [--salt SALT]",
	 "the longest cached prefix of TOKENS", C_LOOKUP, run_lookup},
	{"snapshot", "", "every cached (hash, group) and its block count", C_SNAPSHOT, run_snapshot},
	{"read", "--blocks IDS --out FILE",
	 "save the blocks' contents (held or cached) to FILE, checksums verified; `info` shows "
	 "the payload format", C_READ, run_data},
	{"write", "--blocks IDS --in FILE",
	 "load FILE (blocks x block_bytes) into blocks this session holds (use --session)",
	 C_WRITE, run_data},
	{"copy", "--blocks SRC --to DST", "copy block contents (copy-on-write)", C_COPY, run_data},
	{"events", "[--follow] [--events-url URL] [--count N]",
	 "print events as one JSON object per line (with pool, epoch, seq); --follow keeps going "
	 "(Ctrl-C stops). Default URL ipc:///tmp/kvpool-events.ipc", C_EVENTS, NULL},
	{"vllm-events", "[--vllm-url URL] [--replay-url URL] [--topic PREFIX] [--bind] [--from SEQ] "
	 "[--follow] [--count N]",
	 "follow vLLM's ZMQ event wire (kvpoold --vllm-events, or vLLM itself): one JSON line per "
	 "batch {topic, seq, batch}; gaps repaired through --replay-url. Default URL "
	 "tcp://127.0.0.1:5557", C_VLLM, NULL},
	{"help", "", "this help", C_HELP, NULL},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void
usage(FILE *out)
{
	fprintf(out, "usage: kvpoolctl [options] COMMAND [args]\n\ncommands:\n");
	for (size_t i = 0; i < N_OF(commands); i++) {
		const struct command *c = &commands[i];
		char lhs[160];
		snprintf(lhs, sizeof(lhs), "%s%s%s", c->name, c->args[0] ? " " : "", c->args);
		if (strlen(lhs) <= 24)
			fprintf(out, "  %-24s  %s\n", lhs, c->help);
		else
			fprintf(out, "  %s\n  %-24s  %s\n", lhs, "", c->help);
	}
	fprintf(out, "\noptions (environment in brackets), before or after the command:\n");
	for (size_t i = 0; i < N_OF(opts); i++) {
		const struct opt *p = &opts[i];
		char lhs[64];
		if (p->help == NULL)
			continue; /* a command's own, shown with it */
		snprintf(lhs, sizeof(lhs), "%s%s%s", p->name, p->arg ? " " : "", p->arg ? p->arg : "");
		fprintf(out, "  %-24s  %s%s%s%s\n", lhs, p->help, p->env ? " [" : "",
		        p->env ? p->env : "", p->env ? "]" : "");
	}
	fprintf(out, "\nIDS and TOKENS are comma-separated non-negative integers; a-b ranges are "
	             "allowed.\nExit codes: 0 ok, 1 refused by the daemon, 2 usage, 3 cannot reach "
	             "the daemon,\n4 a local file could not be read or written. With --json every "
	             "error is one\nJSON object on stdout: {command, status, error, exit_code, "
	             "detail}.\n");
}

/* A whole decimal in [min, max], or -1. */
static int
parse_num(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	if (s == NULL || !isdigit((unsigned char)s[0]))
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static const struct opt *
find_opt(const char *name)
{
	for (size_t i = 0; i < N_OF(opts); i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

/* One option's value into x. 0, or an exit code after the message. */
static int
set_opt(struct ctl *x, const struct opt *p, const char *v, const char *from)
{
	void *dst = (char *)x + p->off;
	uint64_t n;
	switch (p->kind) {
	case O_FLAG:
		*(bool *)dst = true;
		return 0;
	case O_STR:
		*(const char **)dst = v;
		return 0;
	case O_U32:
	case O_U64:
		if (parse_num(v, p->min, p->max, &n) != 0)
			return usage_error(x, "%s: '%s' is not a whole number in %llu..%llu%s%s", p->name,
			                   v, (unsigned long long)p->min, (unsigned long long)p->max,
			                   from ? " (from " : "", from ? from : "");
		if (p->kind == O_U32)
			*(uint32_t *)dst = (uint32_t)n;
		else
			*(uint64_t *)dst = n;
		if (p->off == offsetof(struct ctl, from))
			x->has_from = true;
		return 0;
	}
	return 0;
}

static const struct command *
find_command(const char *name)
{
	for (size_t i = 0; i < N_OF(commands); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* Options anywhere, the first word the command, the rest its arguments. 0 or an exit code. */
static int
parse_args(struct ctl *x, int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--json") == 0)
			x->json = true; /* known first, so even a usage error is JSON */
	/* Environment first; flags override. */
	for (size_t i = 0; i < N_OF(opts); i++) {
		const char *v = opts[i].env ? getenv(opts[i].env) : NULL;
		int rv;
		if (v != NULL && v[0] != '\0' && (rv = set_opt(x, &opts[i], v, opts[i].env)) != 0)
			return rv;
	}
	x->pos = calloc((size_t)argc, sizeof(*x->pos));
	if (x->pos == NULL)
		return fail(x, EXIT_LOCAL, KVP_ENOMEM, "out of memory");
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0)
			a = "--help";
		if (a[0] != '-' || isdigit((unsigned char)a[1])) {
			if (x->cmd_name == NULL)
				x->cmd_name = a;
			else
				x->pos[x->npos++] = argv[i];
			continue;
		}
		char name[64];
		const char *eq = strchr(a, '=');
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		snprintf(name, sizeof(name), "%.*s", (int)(nl < 63 ? nl : 63), a);
		const struct opt *p = find_opt(name);
		if (p == NULL)
			return usage_error(x, "unknown option %s", a);
		const char *v = NULL;
		if (p->kind != O_FLAG) {
			if (eq)
				v = eq + 1;
			else if (i + 1 < argc)
				v = argv[++i];
			else
				return usage_error(x, "%s needs a value (%s)", p->name, p->arg);
		} else if (eq) {
			return usage_error(x, "%s takes no value", p->name);
		}
		int rv = set_opt(x, p, v, NULL);
		if (rv != 0)
			return rv;
	}
	if (x->help || x->version)
		return 0;
	if (x->cmd_name == NULL)
		return usage_error(x, "no command given");
	if ((x->cmd = find_command(x->cmd_name)) == NULL)
		return usage_error(x, "unknown command '%s'", x->cmd_name);
	/* Each command option only where it means something. */
	for (int i = 1; i < argc; i++) {
		char name[64];
		const char *eq = strchr(argv[i], '=');
		size_t nl = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
		snprintf(name, sizeof(name), "%.*s", (int)(nl < 63 ? nl : 63), argv[i]);
		const struct opt *p = argv[i][0] == '-' ? find_opt(name) : NULL;
		if (p != NULL && p->only != 0 && !(p->only & x->cmd->bit))
			return usage_error(x, "%s does not take %s", x->cmd->name, p->name);
		if (p != NULL && p->kind != O_FLAG && eq == NULL)
			i++; /* its value */
	}
	return 0;
}

static int
parse_ids(struct ctl *x, const char *what, const char *s, int64_t **out, size_t *n, bool ids)
{
	if (s == NULL)
		return usage_error(x, "%s needs %s", x->cmd->name, what);
	if (parse_i64_list(s, out, n) != 0 || *n == 0)
		return usage_error(x, "%s: '%s' is not a list of non-negative integers (1,2,5-9)",
		                   what, s);
	for (size_t i = 0; ids && i < *n; i++)
		if ((*out)[i] > INT32_MAX)
			return usage_error(x, "%s: block id %lld is out of range", what,
			                   (long long)(*out)[i]);
	return 0;
}

/* Every command's arguments, checked before anything is dialed. 0 or an exit code. */
static int
check_args(struct ctl *x)
{
	unsigned b = x->cmd->bit;
	int rv = 0;

	if (x->token_file != NULL && (x->o.token = read_token_file(x->token_file)) == NULL)
		return fail(x, EXIT_LOCAL, KVP_EINVAL, "cannot read --token-file %s: %s",
		            x->token_file, strerror(errno));
	if (b & C_ALLOC) {
		uint64_t n;
		if (x->npos != 1)
			return usage_error(x, "alloc takes one count, N");
		if (parse_num(x->pos[0], 1, 1u << 24, &n) != 0)
			return usage_error(x, "alloc: '%s' is not a count of blocks (1..16777216)",
			                   x->pos[0]);
		x->alloc_n = (uint32_t)n;
		return 0;
	}
	if (b & (C_FREE | C_TOUCH | C_EVICT)) {
		size_t len = 1;
		if (x->npos == 0)
			return usage_error(x, "%s needs block ids", x->cmd->name);
		for (size_t i = 0; i < x->npos; i++)
			len += strlen(x->pos[i]) + 1;
		char *joined = calloc(1, len);
		if (joined == NULL)
			return fail(x, EXIT_LOCAL, KVP_ENOMEM, "out of memory");
		for (size_t i = 0; i < x->npos; i++) {
			strcat(joined, x->pos[i]);
			if (i + 1 < x->npos)
				strcat(joined, ",");
		}
		rv = parse_ids(x, "block ids", joined, &x->ids, &x->nids, true);
		free(joined);
		return rv;
	}
	if (x->npos > 0)
		return usage_error(x, "%s takes no argument '%s'", x->cmd->name, x->pos[0]);
	if ((b & C_END) && x->o.session_id == 0)
		return usage_error(x, "end needs --session ID");
	if (b & (C_CACHE | C_READ | C_WRITE | C_COPY))
		if ((rv = parse_ids(x, "--blocks IDS", x->blocks, &x->ids, &x->nids, true)) != 0)
			return rv;
	if (b & (C_CACHE | C_LOOKUP))
		if ((rv = parse_ids(x, "--tokens TOKENS", x->tokens, &x->toks, &x->ntoks, false)) != 0)
			return rv;
	if ((b & C_COPY) &&
	    (rv = parse_ids(x, "--to IDS", x->to, &x->dst, &x->ndst, true)) != 0)
		return rv;
	if ((b & C_COPY) && x->ndst != x->nids)
		return usage_error(x, "copy: --to has %zu ids, --blocks %zu", x->ndst, x->nids);
	if ((b & C_READ) && x->out == NULL)
		return usage_error(x, "read needs --out FILE");
	if ((b & C_WRITE) && x->in == NULL)
		return usage_error(x, "write needs --in FILE");
	if ((b & C_VLLM) && x->has_from && x->replay_url == NULL)
		return usage_error(x, "vllm-events: --from needs --replay-url");
	x->keys = (struct kvp_request_keys){.lora_name = x->lora, .cache_salt = x->salt};
	return 0;
}

/* ---- the commands ---- */

static int
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

static int
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

static int
run_end(struct ctl *x)
{
	kvp_client_close(x->c); /* Goodbye */
	x->c = NULL;
	if (!x->json)
		printf("session %" PRIu64 " ended\n", x->o.session_id);
	return KVP_OK;
}

static int
run_alloc(struct ctl *x)
{
	int32_t *ids = malloc(x->alloc_n * sizeof(*ids));
	int rv;
	if (ids == NULL)
		return KVP_ENOMEM;
	if ((rv = kvp_client_allocate(x->c, x->alloc_n, ids)) == KVP_OK) {
		cJSON_AddItemToObject(x->j, "block_ids", ids_json(ids, x->alloc_n));
		if (!x->json)
			print_ids("", ids, x->alloc_n);
		if (x->o.session_id == 0)
			fprintf(stderr, "kvpoolctl: note: these blocks are released when this session "
			                "ends; use `kvpoolctl session` and --session to keep them\n");
	}
	free(ids);
	return rv;
}

static int
run_ids(struct ctl *x)
{
	int32_t *ids = to_ids(x->ids, x->nids);
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
		cJSON_AddItemToObject(x->j, "block_ids", ids_json(ids, x->nids));
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

static int
run_reset(struct ctl *x)
{
	int rv = kvp_client_reset(x->c);
	if (rv == KVP_OK && !x->json)
		printf("prefix cache cleared\n");
	return rv;
}

static int
run_cache(struct ctl *x)
{
	int32_t *ids = to_ids(x->ids, x->nids);
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

static int
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
		cJSON_AddItemToObject(x->j, "block_ids", ids_json(hits, nh));
		cJSON_AddNumberToObject(x->j, "hit_tokens", ht);
		if (!x->json) {
			printf("hit %u tokens in %u block(s): ", ht, nh);
			print_ids("", hits, nh);
		}
	}
	free(hits);
	return rv;
}

static int
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
		hex_into(hex, e->hash, e->hash_len < 1024 ? e->hash_len : 1024);
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

/* A local failure inside a command: reported here, the command returns this. */
#define LOCAL_FAILURE (-1)

/* read / write / copy: block contents to and from files. */
static int
run_data(struct ctl *x)
{
	uint64_t bb = kvp_client_info(x->c)->executor.block_bytes;
	size_t n = x->nids, len = 0;
	unsigned char *buf = NULL;
	int32_t *ids = to_ids(x->ids, n), *dst = NULL;
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
		if ((dst = to_ids(x->dst, n)) == NULL)
			goto out;
		if ((rv = kvp_client_copy_blocks(x->c, ids, dst, n)) == KVP_OK && !x->json)
			printf("copied %zu block(s)\n", n);
	} else if (x->cmd->bit == C_READ) {
		FILE *f;
		if ((buf = malloc(n * bb)) == NULL || (crcs = malloc(n * sizeof(*crcs))) == NULL)
			goto out;
		if ((rv = kvp_client_read_blocks(x->c, ids, n, buf, n * bb, crcs)) != KVP_OK)
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
		cJSON_AddItemToObject(x->j, "block_ids", ids_json(ids, n));
out:
	free(ids);
	free(dst);
	free(buf);
	free(crcs);
	return rv;
}

static int
follow_events(struct ctl *x)
{
	const struct kvp_client_options *o = &x->o;
	const char *url = x->events_url ? x->events_url : "ipc:///tmp/kvpool-events.ipc";
	struct follow f = {.pool = o->pool, .max = x->count};
	struct kvp_sub_options so = {.events_url = url, .rpc_url = o->url, .pool = o->pool,
	                             .token = o->token, .timeout_ms = o->timeout_ms,
	                             .tls_ca_file = o->tls_ca_file, .tls_cert_file = o->tls_cert_file,
	                             .tls_key_file = o->tls_key_file,
	                             .tls_server_name = o->tls_server_name};
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

static int
vllm_events(struct ctl *x)
{
	struct kvp_vllm_watch_options w = {
		.url = x->vllm_url ? x->vllm_url : "tcp://127.0.0.1:5557",
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

static int
run(struct ctl *x)
{
	int rv;
	bool keep = x->cmd->bit == C_SESSION || x->o.session_id != 0;

	if (x->cmd->bit == C_EVENTS)
		return follow_events(x);
	if (x->cmd->bit == C_VLLM)
		return vllm_events(x);
	if ((rv = kvp_client_open(&x->o, &x->c)) != KVP_OK)
		return fail(x, exit_of(rv), rv, "%s: pool %s at %s: %s", kvp_status_name(rv),
		            x->o.pool, x->o.url, kvp_client_open_detail());
	x->j = cJSON_CreateObject();
	cJSON_AddStringToObject(x->j, "command", x->cmd->name);
	rv = x->cmd->run(x);
	int code = EXIT_OK;
	if (rv == LOCAL_FAILURE) {
		code = x->reported; /* reported already, its code chosen there */
	} else if (rv != KVP_OK) {
		code = refused(x, rv, x->c ? kvp_client_last_detail(x->c) : "");
	} else if (x->json) {
		cJSON_AddStringToObject(x->j, "status", kvp_status_name(KVP_OK));
		char *s = cJSON_PrintUnformatted(x->j);
		if (s)
			printf("%s\n", s);
		free(s);
	}
	if (x->c != NULL) {
		if (keep)
			kvp_client_detach(x->c);
		else
			kvp_client_close(x->c);
	}
	return code;
}

int
main(int argc, char **argv)
{
	struct ctl x = {0};
	int code;

	x.o.url = "ipc:///tmp/kvpool.ipc";
	x.o.pool = "default";
	x.o.client_name = "kvpoolctl";
	x.o.connect_timeout_ms = 2000;
	if ((code = parse_args(&x, argc, argv)) != 0)
		goto out;
	if (x.help || (x.cmd && x.cmd->bit == C_HELP)) {
		usage(stdout);
		goto out;
	}
	if (x.version) {
		printf("kvpoolctl %s (commit %s)\n", KVP_VERSION, KVP_GIT_COMMIT);
		goto out;
	}
	if ((code = check_args(&x)) != 0)
		goto out;
	code = run(&x);
out:
	cJSON_Delete(x.j);
	free(x.pos);
	free(x.ids);
	free(x.toks);
	free(x.dst);
	return code;
}
