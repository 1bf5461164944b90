/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L
#include "service/rpc/decode_arena.h"

#include <pthread.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* After a spill this large, the freed pages go back to the kernel. */
#define KVPD_TRIM_AFTER_BYTES (16u << 20)

static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;

static void
arena_destroy(void *p)
{
	struct kvpd_decode_arena *a = p;
	for (size_t i = 0; i < a->nspill; i++)
		free(a->spill[i]);
	free(a->spill);
	free(a->buf);
	free(a);
}

static void
arena_key_make(void)
{
	(void)pthread_key_create(&arena_key, arena_destroy);
}

void *
kvpd_decode_arena_alloc(void *data, size_t size)
{
	struct kvpd_decode_arena *a = data;
	size_t need = (size + 15) & ~(size_t)15;
	if (a->used + need <= a->cap) {
		void *p = a->buf + a->used;
		a->used += need;
		return p;
	}
	/* Too big for what is left: a plain allocation, freed at reset. */
	if (a->nspill == a->capspill) {
		size_t cap = a->capspill ? a->capspill * 2 : 16;
		void **np = realloc(a->spill, cap * sizeof(*np));
		if (np == NULL)
			return NULL;
		a->spill = np;
		a->capspill = cap;
	}
	void *p = malloc(size ? size : 1);
	if (p != NULL) {
		a->spill[a->nspill++] = p;
		a->spill_bytes += size;
	}
	return p;
}

void
kvpd_decode_arena_free(void *data, void *p)
{
	(void)data; /* everything goes at reset */
	(void)p;
}

struct kvpd_decode_arena *
kvpd_decode_arena_get(void)
{
	struct kvpd_decode_arena *a;
	(void)pthread_once(&arena_once, arena_key_make);
	if ((a = pthread_getspecific(arena_key)) != NULL)
		return a;
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return NULL;
	a->cap = 256u << 10;
	if ((a->buf = malloc(a->cap)) == NULL || pthread_setspecific(arena_key, a) != 0) {
		free(a->buf);
		free(a);
		return NULL;
	}
	return a;
}

void
kvpd_decode_arena_reset(struct kvpd_decode_arena *a)
{
	size_t spilled = 0;
	for (size_t i = 0; i < a->nspill; i++)
		free(a->spill[i]);
	spilled = a->nspill;
	a->nspill = 0;
	a->used = 0;
#ifdef __GLIBC__
	/* After a spike (a huge request), give the pages back rather than keep them. */
	if (a->spill_bytes >= KVPD_TRIM_AFTER_BYTES)
		(void)malloc_trim(0);
#endif
	a->spill_bytes = 0;
	/* A request that spilled wants a bigger arena next time (up to 8 MiB). */
	if (spilled > 0 && a->cap < (8u << 20)) {
		uint8_t *nb = malloc(a->cap * 2);
		if (nb != NULL) {
			free(a->buf);
			a->buf = nb;
			a->cap *= 2;
		}
	}
}

