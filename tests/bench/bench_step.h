/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_step.h: what kvp-bench-step's files share: S256's shape, its
 * workload generator and correctness checks (bench_step_wl.c), the core
 * run (bench_step_core.c) and the options they read. Internal to the bench.
 */
#ifndef KVP_BENCH_STEP_H
#define KVP_BENCH_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/block_hash.h"

#define RUNNING 256
#define FINISH 8
#define ARRIVE 8
#define PROMPT 1024
#define SYS 512
#define NUM_SYS 4
#define NUM_BLOCKS 32768
#define BS 16
#define VOCAB 151643
#define LIVE_RING 1024 /* > RUNNING + ARRIVE: request a's slot is a % LIVE_RING */
#define MAX_NEW (PROMPT / BS + 2)
#define NONE_FP "c5a1a573d87aa336"

/* Per step: who decodes (with which token), who finishes, who arrives (with which prompt). */
struct step {
	uint64_t dec[RUNNING];
	int64_t dec_tok[RUNNING];
	size_t ndec;
	uint64_t fin[FINISH];
	size_t nfin;
	uint64_t arr[ARRIVE];
	int64_t prompt[ARRIVE][PROMPT];
};

struct wl {
	uint64_t run[RUNNING + ARRIVE];  /* R, oldest first */
	size_t nrun;
	uint32_t ndecoded[LIVE_RING];
	uint64_t next_arrival, steps;
	/* the correctness values */
	uint64_t digest, hit_tokens, num_events;
};

struct checks {
	uint64_t steps, arrivals, running, hit_tokens, blocks_in_use, free, cached_blocks,
		cached_keys, digest, num_events, removed;
	char hash_set[17], none_fp[17];
};

struct timing {
	double *wall, *cpu, *build; /* per timed step, seconds */
	double daemon_cpu;          /* per step, seconds (mean over the timed steps) */
	size_t req_bytes, rep_bytes;
};

/* Options (set by main before any run; see their definitions). */
extern uint64_t seed;
extern uint8_t *cold_buf;
extern size_t cold_len;
extern char replay_mib[24];
extern bool plain_wire;
extern uint32_t ones[RUNNING];

/* ---- the workload (bench_step_wl.c; not timed) ---- */

void cold_touch(void);
uint64_t digest_call(uint64_t h, const int32_t *ids, size_t n);
void wl_init(struct wl *w);
void wl_next(struct wl *w, struct step *st);
int check_vectors(void);

/* ---- results ---- */

void hex8(const uint8_t *b, char out[17]);
int hash_set(struct kvp_hasher *h, uint8_t *hashes, size_t n, char out[17]);
int report_checks(const char *what, const struct checks *c, uint64_t w, uint64_t n, bool events);
double thread_cpu(void);

/* ---- core: the daemon's handling of the encoded step, in process (bench_step_core.c) ---- */

int run_core(uint64_t w_steps, uint64_t n_steps, bool events, struct timing *t, struct checks *c);

#endif /* KVP_BENCH_STEP_H */
