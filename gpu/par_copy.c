/* SPDX-License-Identifier: Apache-2.0 */
/* par_copy.c: see par_copy.h. */
#include "gpu/par_copy.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/kvp_status.h"

struct kvp_par_copy {
	pthread_mutex_t mu;
	pthread_cond_t go, done_cv;
	unsigned threads, started;   /* in all; helpers running */
	uint64_t gen;                /* bumped for each copy; helpers wait for a new one */
	unsigned parts, done;        /* this copy's slices; helpers' slices finished */
	unsigned char *dst;
	const unsigned char *src;
	size_t len, slice;
	int stop;
	pthread_t tid[KVP_PAR_COPY_MAX_THREADS];
};

struct helper {
	struct kvp_par_copy *pc;
	unsigned index; /* 1..threads-1: its slice; the caller copies slice 0 */
};

static void
copy_slice(struct kvp_par_copy *pc, unsigned i)
{
	size_t off = (size_t)i * pc->slice;
	if (off < pc->len)
		memcpy(pc->dst + off, pc->src + off, pc->len - off < pc->slice ? pc->len - off : pc->slice);
}

static void *
helper_main(void *arg)
{
	struct kvp_par_copy *pc = ((struct helper *)arg)->pc;
	unsigned index = ((struct helper *)arg)->index;
	uint64_t seen = 0;
	free(arg);
	pthread_mutex_lock(&pc->mu);
	for (;;) {
		while (!pc->stop && pc->gen == seen)
			pthread_cond_wait(&pc->go, &pc->mu);
		if (pc->stop)
			break;
		seen = pc->gen;
		if (index >= pc->parts)
			continue; /* too small a copy to need this helper */
		pthread_mutex_unlock(&pc->mu);
		copy_slice(pc, index);
		pthread_mutex_lock(&pc->mu);
		if (++pc->done == pc->parts - 1)
			pthread_cond_signal(&pc->done_cv);
	}
	pthread_mutex_unlock(&pc->mu);
	return NULL;
}

int
kvp_par_copy_open(unsigned threads, struct kvp_par_copy **out)
{
	struct kvp_par_copy *pc;
	if (out == NULL || threads == 0 || threads > KVP_PAR_COPY_MAX_THREADS)
		return KVP_EINVAL;
	if ((pc = calloc(1, sizeof(*pc))) == NULL)
		return KVP_ENOMEM;
	pc->threads = threads;
	if (pthread_mutex_init(&pc->mu, NULL) != 0) {
		free(pc);
		return KVP_EINTERNAL;
	}
	if (pthread_cond_init(&pc->go, NULL) != 0) {
		pthread_mutex_destroy(&pc->mu);
		free(pc);
		return KVP_EINTERNAL;
	}
	if (pthread_cond_init(&pc->done_cv, NULL) != 0) {
		pthread_cond_destroy(&pc->go);
		pthread_mutex_destroy(&pc->mu);
		free(pc);
		return KVP_EINTERNAL;
	}
	for (unsigned i = 1; i < threads; i++) {
		struct helper *h = malloc(sizeof(*h));
		if (h == NULL || (h->pc = pc, h->index = i,
		                  pthread_create(&pc->tid[i], NULL, helper_main, h) != 0)) {
			free(h);
			kvp_par_copy_close(pc);
			return KVP_EINTERNAL;
		}
		pc->started++;
	}
	*out = pc;
	return KVP_OK;
}

void
kvp_par_copy_close(struct kvp_par_copy *pc)
{
	if (pc == NULL)
		return;
	pthread_mutex_lock(&pc->mu);
	pc->stop = 1;
	pthread_cond_broadcast(&pc->go);
	pthread_mutex_unlock(&pc->mu);
	for (unsigned i = 1; i <= pc->started; i++)
		pthread_join(pc->tid[i], NULL);
	pthread_cond_destroy(&pc->done_cv);
	pthread_cond_destroy(&pc->go);
	pthread_mutex_destroy(&pc->mu);
	free(pc);
}

unsigned
kvp_par_copy_threads(const struct kvp_par_copy *pc)
{
	return pc ? pc->threads : 1;
}

void
kvp_par_copy(struct kvp_par_copy *pc, void *dst, const void *src, size_t len)
{
	size_t parts;
	if (pc == NULL || pc->threads == 1 || len < 2 * (size_t)KVP_PAR_COPY_MIN_SLICE) {
		if (len)
			memcpy(dst, src, len);
		return;
	}
	parts = len / KVP_PAR_COPY_MIN_SLICE;
	if (parts > pc->threads)
		parts = pc->threads;
	pthread_mutex_lock(&pc->mu);
	pc->dst = dst;
	pc->src = src;
	pc->len = len;
	/* Slices of whole cache lines, the last one shorter. */
	pc->slice = ((len + parts - 1) / parts + 63) & ~(size_t)63;
	pc->parts = (unsigned)parts;
	pc->done = 0;
	pc->gen++;
	pthread_cond_broadcast(&pc->go);
	pthread_mutex_unlock(&pc->mu);
	copy_slice(pc, 0);
	pthread_mutex_lock(&pc->mu);
	while (pc->done < pc->parts - 1)
		pthread_cond_wait(&pc->done_cv, &pc->mu);
	pthread_mutex_unlock(&pc->mu);
}
