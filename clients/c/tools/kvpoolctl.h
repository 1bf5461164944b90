/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvpoolctl.h: what kvpoolctl's files share (kvpoolctl.c: options, the
 * command table, checking and main; ctl_commands.c: the calls; ctl_events.c:
 * the event followers). Internal to the program.
 */
#ifndef KVPOOLCTL_H
#define KVPOOLCTL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clients/c/kvpool.h"

/* Exit codes, as `kvpoolctl --help` documents them. */
enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_LOCAL = 4 };

/* Commands, each a bit in the options' `only` masks. */
enum {
	C_INFO = 1u << 0, C_STATS = 1u << 1, C_SESSION = 1u << 2, C_END = 1u << 3,
	C_ALLOC = 1u << 4, C_FREE = 1u << 5, C_TOUCH = 1u << 6, C_EVICT = 1u << 7,
	C_RESET = 1u << 8, C_CACHE = 1u << 9, C_LOOKUP = 1u << 10, C_SNAPSHOT = 1u << 11,
	C_READ = 1u << 12, C_WRITE = 1u << 13, C_COPY = 1u << 14, C_EVENTS = 1u << 15,
	C_VLLM = 1u << 16, C_HELP = 1u << 17, C_REGION = 1u << 18,
};

/* A row of the command table. */
struct ctl;
struct command {
	const char *name, *args, *help;
	unsigned bit;
	int (*run)(struct ctl *x); /* with x->c open; NULL: the command dials itself, or not at all */
};

/* One invocation: its options, checked arguments and, once dialed, the client. */
struct ctl {
	struct kvp_client_options o;
	const struct command *cmd;
	const char *cmd_name;
	bool json;
	/* command options */
	const char *blocks, *tokens, *to, *in, *out, *events_url, *lora, *lora_path, *salt,
	           *token_file;
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
	int32_t row;            /* region ROW; 0: none */
	struct kvp_request_keys keys;
	/* after dialing */
	struct kvp_client *c;
	cJSON *j;
	int reported;   /* the exit code of the error fail() printed */
};

/* One error, a line on stderr or (--json) one object on stdout. Returns code. */
int fail(struct ctl *x, int code, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define usage_error(x, ...) fail((x), EXIT_USAGE, KVP_EINVAL, __VA_ARGS__)
/* The exit code of a status from the library or the daemon. */
int exit_of(int status);
/* A failed call: its status and detail reported; returns the exit code. */
int refused(struct ctl *x, int status, const char *detail);

/* A command's own error, already reported (its code in x->reported). */
#define LOCAL_FAILURE (-1)

/* The commands that call the daemon: a kvp status, or LOCAL_FAILURE. */
int run_info(struct ctl *x);
int run_stats(struct ctl *x);
int run_end(struct ctl *x);
int run_alloc(struct ctl *x);
int run_ids(struct ctl *x);
int run_reset(struct ctl *x);
int run_cache(struct ctl *x);
int run_lookup(struct ctl *x);
int run_snapshot(struct ctl *x);
int run_data(struct ctl *x);
int run_region(struct ctl *x);

/* events and vllm-events dial on their own: they return an exit code. */
int ctl_follow_events(struct ctl *x);
int ctl_vllm_events(struct ctl *x);

int32_t *ctl_to_ids(const int64_t *v, size_t n);
cJSON *ctl_ids_json(const int32_t *ids, size_t n);
void ctl_print_ids(const char *label, const int32_t *ids, size_t n);
void ctl_hex_into(char *dst, const uint8_t *b, size_t n);

#endif /* KVPOOLCTL_H */
