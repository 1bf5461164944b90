/* SPDX-License-Identifier: Apache-2.0 */
/* bench_step_wl.c: S256's workload, its test vectors and its correctness checks (bench_step.h). */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_step.h"
#include "common/kvp_status.h"

/* ---- the workload (not timed) ---- */

static uint64_t
mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t seed;

/*
 * --cold MIB: before each in-process step (engine, core), untimed, write a
 * buffer of MIB MiB, so the step starts with caches as cold as a daemon's
 * are after the client, the kernel and nng's threads ran in between.
 */
uint8_t *cold_buf;
size_t cold_len;

/*
 * --replay-mib MIB (default 4): the replay ring of the daemons (core and
 * remote). Small enough that the ring wraps during the warm-up, so the timed
 * steps with events on see a daemon's steady state. Until a pool's ring first
 * fills (kvpoold's default, 64 MiB, is about 1,100 S256 steps), each step's
 * encoded batch lands on fresh pages, and the step pays their faults.
 */
char replay_mib[24] = "4";

/*
 * --plain: the decodes as 248 AllocateSlots messages (kvp_batch_allocate_slots
 * each), not as one slots run (kvp_batch_allocate_slots_n), the default.
 */
bool plain_wire;
uint32_t ones[RUNNING]; /* every decode's counts */

void
cold_touch(void)
{
	for (size_t i = 0; i < cold_len; i += 64)
		cold_buf[i]++;
}

static int64_t
tok(uint64_t d, uint64_t r, uint64_t j)
{
	return (int64_t)(mix64(((d << 60) | (r << 20) | j) ^ mix64(seed)) % VOCAB);
}

static uint64_t
fnv_words(uint64_t h, const uint32_t *w, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ w[i]) * 0x100000001b3ull;
	return h;
}

#define FNV_OFFSET 0xcbf29ce484222325ull

/* One allocate_slots call's digest words: how many new blocks, then their ids. */
uint64_t
digest_call(uint64_t h, const int32_t *ids, size_t n)
{
	uint32_t count = (uint32_t)n;
	h = fnv_words(h, &count, 1);
	for (size_t k = 0; k < n; k++) {
		uint32_t id = (uint32_t)ids[k];
		h = fnv_words(h, &id, 1);
	}
	return h;
}



void
wl_init(struct wl *w)
{
	memset(w, 0, sizeof(*w));
	w->digest = FNV_OFFSET;
}

/* Fills st with step w->steps and advances R (as the step will leave it). */
void
wl_next(struct wl *w, struct step *st)
{
	st->ndec = w->nrun;
	for (size_t i = 0; i < w->nrun; i++) {
		uint64_t a = w->run[i];
		st->dec[i] = a;
		st->dec_tok[i] = tok(3, a, w->ndecoded[a % LIVE_RING]++);
	}
	st->nfin = 0;
	if (w->nrun == RUNNING) {
		for (size_t i = 0; i < FINISH; i++)
			st->fin[st->nfin++] = w->run[i];
		memmove(w->run, w->run + FINISH, (RUNNING - FINISH) * sizeof(w->run[0]));
		w->nrun -= FINISH;
	}
	for (size_t i = 0; i < ARRIVE; i++) {
		uint64_t a = w->next_arrival++;
		st->arr[i] = a;
		for (int j = 0; j < SYS; j++)
			st->prompt[i][j] = tok(1, a % NUM_SYS, (uint64_t)j);
		for (int j = 0; j < PROMPT - SYS; j++)
			st->prompt[i][SYS + j] = tok(2, a, (uint64_t)j);
		w->ndecoded[a % LIVE_RING] = 0;
		w->run[w->nrun++] = a;
	}
	w->steps++;
}

/* The spec's test vectors: a wrong generator would make every check meaningless. */
int
check_vectors(void)
{
	uint64_t saved = seed;
	int ok = 1;
	seed = 0;
	ok &= mix64(1) == 0x5692161d100b05e5ull;
	ok &= tok(1, 0, 0) == 125541 && tok(1, 0, 1) == 60544 && tok(1, 0, 3) == 60801;
	ok &= tok(1, 3, 511) == 114152;
	ok &= tok(2, 0, 0) == 54735 && tok(2, 0, 3) == 28307 && tok(2, 9, 0) == 44061;
	ok &= tok(3, 0, 0) == 2465 && tok(3, 0, 3) == 87009;
	seed = 1;
	ok &= tok(1, 0, 0) == 126858 && tok(1, 0, 3) == 102889;
	uint32_t words[] = {2, 7, 9};
	ok &= fnv_words(FNV_OFFSET, words, 3) == 0xea95df1875d692ddull;
	seed = saved;
	return ok;
}

/* ---- results ---- */



static const struct {
	uint64_t w, n, hit, digest, events, removed;
	const char *hash_set;
} REF[] = {
	{160, 16, 718848, 0x2a53be8b46c0e851ull, 18929, 15089, "052a51ed4bab8d4e"},
	{200, 8, 849920, 0xd2fa29ffeed1f691ull, 28401, 23793, "d44e4d691b8a54e4"},
	{256, 256, 2095104, 0x374a8c0702277bb4ull, 118385, 106481, "79d01f9baf79a6c2"},
};

void
hex8(const uint8_t *b, char out[17])
{
	for (int i = 0; i < 8; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int
cmp_hash(const void *a, const void *b)
{
	return memcmp(a, b, KVP_HASH_LEN);
}

/* First 8 bytes of SHA-256 over the sorted 32-byte hashes. */
int
hash_set(struct kvp_hasher *h, uint8_t *hashes, size_t n, char out[17])
{
	uint8_t d[KVP_HASH_LEN];
	qsort(hashes, n, KVP_HASH_LEN, cmp_hash);
	if (kvp_hash_raw(h, hashes, n * KVP_HASH_LEN, d) != KVP_OK)
		return -1;
	hex8(d, out);
	return 0;
}

/* Prints the checks; returns 0 if they match the reference row for (w, n) (or none exists). */
int
report_checks(const char *what, const struct checks *c, uint64_t w, uint64_t n, bool events)
{
	int bad = 0;
	printf("%s: steps=%" PRIu64 " arrivals=%" PRIu64 " running=%" PRIu64 " hit_tokens=%" PRIu64
	       " blocks_in_use=%" PRIu64 " free=%" PRIu64 " cached_blocks=%" PRIu64
	       " cached_keys=%" PRIu64 " digest=%016" PRIx64 " hash_set=%s none_fp=%s",
	       what, c->steps, c->arrivals, c->running, c->hit_tokens, c->blocks_in_use, c->free,
	       c->cached_blocks, c->cached_keys, c->digest, c->hash_set, c->none_fp);
	if (events)
		printf(" num_events=%" PRIu64, c->num_events);
	printf(" evicted=%" PRIu64 "\n", c->removed);
	bad |= c->running != RUNNING || c->steps != w + n || c->arrivals != 8 * (w + n);
	bad |= strcmp(c->none_fp, NONE_FP) != 0;
	if (seed == 0 && w >= 31)
		bad |= c->blocks_in_use != 8688 || c->free != 24079 || c->cached_blocks != 32527 ||
		       c->cached_keys != 32527;
	for (size_t i = 0; seed == 0 && i < sizeof(REF) / sizeof(REF[0]); i++) {
		if (REF[i].w != w || REF[i].n != n)
			continue;
		bad |= c->hit_tokens != REF[i].hit || c->digest != REF[i].digest ||
		       strcmp(c->hash_set, REF[i].hash_set) != 0 || c->removed != REF[i].removed;
		if (events)
			bad |= c->num_events != REF[i].events;
		printf("%s: checked against the reference row W=%" PRIu64 " N=%" PRIu64 ": %s\n", what,
		       w, n, bad ? "MISMATCH" : "ok");
	}
	if (bad)
		fprintf(stderr, "bench: %s: correctness values differ from S256's\n", what);
	return bad;
}

double
thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
