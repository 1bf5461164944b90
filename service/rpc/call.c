/* SPDX-License-Identifier: Apache-2.0 */
/* One call in progress: its status, detail and scratch memory (call.h). */
#include "service/rpc/call.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/rpc/dispatch.h"


int
kvpd_fail(struct call *c, int status, const char *fmt, ...)
{
	va_list ap;
	c->status = status;
	va_start(ap, fmt);
	vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
	va_end(ap);
	return status;
}

/*
 * Zeroed memory that lives until the call's reply is packed. It comes from
 * the pool's arena (the pool's lock is held): a batch builds hundreds of
 * reply messages, and a heap allocation each cost more than the calls.
 */
void *
kvpd_scratch(struct call *c, size_t n)
{
	struct kvpd_arena *a = &c->p->arena;
	size_t need = (n + 15) & ~(size_t)15;

	if (need == 0)
		need = 16;
	if (a->cur == NULL || a->cur->used + need > a->cur->cap) {
		/* The next kept chunk if it fits, else a new one. */
		struct kvpd_chunk *next = a->cur ? a->cur->next : a->head;
		if (next == NULL || next->cap < need) {
			size_t cap = need > KVPD_CHUNK ? need : KVPD_CHUNK;
			struct kvpd_chunk *ch = calloc(1, sizeof(*ch) + cap);
			if (ch == NULL) {
				c->oom = true;
				return NULL;
			}
			ch->cap = cap;
			ch->next = next;
			if (a->cur)
				a->cur->next = ch;
			else
				a->head = ch;
			next = ch;
		}
		a->cur = next;
	}
	void *p = a->cur->data + a->cur->used;
	a->cur->used += need;
	return p;
}

char *
kvpd_scratch_str(struct call *c, const char *s)
{
	size_t len = strlen(s) + 1;
	char *d = kvpd_scratch(c, len);
	if (d != NULL)
		memcpy(d, s, len);
	return d;
}

/* Zeroes what the call used and keeps the chunks (freeing oversized ones). */
void
kvpd_scratch_reset(struct kvpd_pool *p)
{
	struct kvpd_arena *a = &p->arena;
	struct kvpd_chunk **link = &a->head;
	size_t kept = 0;

	while (*link) {
		struct kvpd_chunk *ch = *link;
		memset(ch->data, 0, ch->used);
		ch->used = 0;
		if (kept + ch->cap > KVPD_ARENA_KEEP) {
			*link = ch->next;
			free(ch);
			continue;
		}
		kept += ch->cap;
		link = &ch->next;
	}
	a->cur = NULL;
}

void
kvpd_arena_fini(struct kvpd_arena *a)
{
	while (a->head) {
		struct kvpd_chunk *ch = a->head;
		a->head = ch->next;
		free(ch);
	}
	a->cur = NULL;
}

/* A zeroed, initialised protobuf-c message that frees itself with the call. */
void *
kvpd_new_msg(struct call *c, const ProtobufCMessageDescriptor *d)
{
	void *m = kvpd_scratch(c, d->sizeof_message);
	if (m != NULL)
		protobuf_c_message_init(d, m);
	return m;
}
