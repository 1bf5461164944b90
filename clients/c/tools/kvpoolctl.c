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
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/c/tools/kvpoolctl.h"
#include "common/kvp_version.h"
#include "proto/wire.h"

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
	{"--tls-server-name", "NAME", NULL, "name to verify (default the URL's host; needed for "
	 "an IP address)", O_STR, F(o.tls_server_name), 0, 0, 0},
	{"--tls-insecure", NULL, NULL, "do not verify the daemon's certificate (tests only; "
	 "without --tls-ca the system's CA bundle verifies it)", O_FLAG, F(o.tls_insecure), 0, 0, 0},
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
	{"--lora-path", "PATH", NULL, NULL, O_STR, F(lora_path), C_CACHE | C_LOOKUP, 0, 0},
	{"--salt", "SALT", NULL, NULL, O_STR, F(salt), C_CACHE | C_LOOKUP, 0, 0},
	{"--to", "IDS", NULL, NULL, O_STR, F(to), C_COPY, 0, 0},
	{"--in", "FILE", NULL, NULL, O_STR, F(in), C_WRITE, 0, 0},
	{"--out", "FILE", NULL, NULL, O_STR, F(out), C_READ | C_REGION, 0, 0},
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
	{"cache",
	 "--blocks IDS --tokens TOKENS [--num-cached N] [--lora NAME --lora-path PATH] "
	 "[--salt SALT]",
	 "cache the full blocks of TOKENS in IDS (hashed by the daemon)", C_CACHE, run_cache},
	{"lookup", "--tokens TOKENS [--lora NAME --lora-path PATH] [--salt SALT]",
	 "the longest cached prefix of TOKENS", C_LOOKUP, run_lookup},
	{"snapshot", "", "every cached (hash, group) and its block count", C_SNAPSHOT, run_snapshot},
	{"read", "--blocks IDS --out FILE",
	 "save the blocks' contents to FILE (under a reference taken for the read), checksums "
	 "verified; `info` shows the payload format", C_READ, run_data},
	{"write", "--blocks IDS --in FILE",
	 "load FILE (blocks x block_bytes) into blocks this session holds (use --session)",
	 C_WRITE, run_data},
	{"copy", "--blocks SRC --to DST", "copy block contents (copy-on-write)", C_COPY, run_data},
	{"region", "[ROW]",
	 "the pool's shared region (its file, row size and count); with ROW, that row's CRC32C and "
	 "first bytes, read through this host's mapping (--out FILE saves it)", C_REGION,
	 run_region},
	{"events", "[--follow] [--events-url URL] [--count N]",
	 "print events as one JSON object per line (with pool, epoch, seq); --follow keeps going "
	 "(Ctrl-C stops). Default URL ipc:///tmp/kvpool-events.ipc", C_EVENTS, NULL},
	{"vllm-events", "[--vllm-url URL] [--replay-url URL] [--topic PREFIX] [--bind] [--from SEQ] "
	 "[--follow] [--count N]",
	 "follow vLLM's ZMQ event wire (kvpoold --vllm-events, or vLLM itself): one JSON line per "
	 "batch {topic, seq, batch}; gaps repaired through --replay-url. Default URL "
	 KVP_DEFAULT_VLLM_URL, C_VLLM, NULL},
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
	if (b & C_REGION) {
		uint64_t n;
		if (x->npos > 1)
			return usage_error(x, "region takes at most one row number");
		if (x->npos == 1 && parse_num(x->pos[0], 1, INT32_MAX, &n) != 0)
			return usage_error(x, "region: '%s' is not a row number (1..)", x->pos[0]);
		x->row = x->npos == 1 ? (int32_t)n : 0;
		return 0;
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
	/* vLLM 0.33 hashes a LoRA's name and path: a default pool refuses a name alone. */
	if (x->lora_path != NULL && x->lora == NULL)
		return usage_error(x, "--lora-path needs --lora");
	x->keys = (struct kvp_request_keys){.lora_name = x->lora, .lora_path = x->lora_path,
	                                    .cache_salt = x->salt};
	return 0;
}

static int
run(struct ctl *x)
{
	int rv;
	bool keep = x->cmd->bit == C_SESSION || x->o.session_id != 0;

	if (x->cmd->bit == C_EVENTS)
		return ctl_follow_events(x);
	if (x->cmd->bit == C_VLLM)
		return ctl_vllm_events(x);
	/* Opening refuses bad options (a URL nng cannot dial, say) with EINVAL: usage errors. */
	if ((rv = kvp_client_open(&x->o, &x->c)) != KVP_OK)
		return fail(x, rv == KVP_EINVAL ? EXIT_USAGE : exit_of(rv), rv, "%s: pool %s at %s: %s",
		            kvp_status_wire_name(rv), x->o.pool, x->o.url, kvp_client_open_detail());
	x->j = cJSON_CreateObject();
	cJSON_AddStringToObject(x->j, "command", x->cmd->name);
	rv = x->cmd->run(x);
	int code = EXIT_OK;
	if (rv == LOCAL_FAILURE) {
		code = x->reported; /* reported already, its code chosen there */
	} else if (rv != KVP_OK) {
		code = refused(x, rv, x->c ? kvp_client_last_detail(x->c) : "");
	} else if (x->json) {
		cJSON_AddStringToObject(x->j, "status", kvp_status_wire_name(KVP_OK));
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

	x.o.url = KVP_DEFAULT_RPC_URL;
	x.o.pool = "default";
	x.o.client_name = "kvpoolctl";
	x.o.connect_timeout_ms = 2000;
	x.o.retries = KVP_RETRIES_DEFAULT;
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
