#include "free_queue.h"

#include <assert.h>

#include "kvp_status.h"

void
kvp_queue_init(struct kvp_queue *q, struct kvp_block *blocks, uint32_t n,
               const int32_t *order, size_t count)
{
	q->blocks = blocks;
	q->head = (int32_t)n;
	q->tail = (int32_t)n + 1;
	q->num_free = 0;
	for (uint32_t i = 0; i < n; i++) {
		blocks[i].prev = KVP_QUEUE_UNLINKED;
		blocks[i].next = KVP_QUEUE_UNLINKED;
	}
	blocks[q->head].prev = KVP_QUEUE_UNLINKED;
	blocks[q->head].next = q->tail;
	blocks[q->tail].prev = q->head;
	blocks[q->tail].next = KVP_QUEUE_UNLINKED;
	for (size_t i = 0; i < count; i++) {
		assert(order[i] >= 0 && (uint32_t)order[i] < n);
		int rv = kvp_queue_append(q, order[i]);
		assert(rv == KVP_OK);
		(void)rv;
	}
}

int32_t
kvp_queue_popleft(struct kvp_queue *q)
{
	int32_t id;

	if (q->num_free == 0)
		return -1;
	(void)kvp_queue_popleft_n(q, 1, &id);
	return id;
}

int
kvp_queue_popleft_n(struct kvp_queue *q, uint32_t n, int32_t *out)
{
	struct kvp_block *b = q->blocks;
	int32_t cur;

	if (n > q->num_free)
		return KVP_ENOSPACE;
	if (n == 0)
		return KVP_OK;
	cur = b[q->head].next;
	for (uint32_t i = 0; i < n; i++) {
		int32_t nx = b[cur].next;
		out[i] = cur;
		b[cur].prev = KVP_QUEUE_UNLINKED;
		b[cur].next = KVP_QUEUE_UNLINKED;
		cur = nx;
	}
	b[q->head].next = cur;
	b[cur].prev = q->head;
	q->num_free -= n;
	return KVP_OK;
}

int
kvp_queue_remove(struct kvp_queue *q, int32_t id)
{
	struct kvp_block *b = q->blocks;
	int32_t p, nx;

	if (!kvp_queue_contains(q, id))
		return KVP_ENOTFOUND;
	p = b[id].prev;
	nx = b[id].next;
	b[p].next = nx;
	b[nx].prev = p;
	b[id].prev = KVP_QUEUE_UNLINKED;
	b[id].next = KVP_QUEUE_UNLINKED;
	q->num_free--;
	return KVP_OK;
}

int
kvp_queue_append(struct kvp_queue *q, int32_t id)
{
	if (kvp_queue_contains(q, id))
		return KVP_ESTATE;
	kvp_queue_append_n(q, &id, 1);
	return KVP_OK;
}

void
kvp_queue_append_n(struct kvp_queue *q, const int32_t *ids, size_t n)
{
	struct kvp_block *b = q->blocks;
	int32_t last;

	if (n == 0)
		return;
	last = b[q->tail].prev;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		assert(!kvp_queue_contains(q, id));
		b[last].next = id;
		b[id].prev = last;
		last = id;
	}
	b[last].next = q->tail;
	b[q->tail].prev = last;
	q->num_free += (uint32_t)n;
}

int32_t
kvp_queue_first(const struct kvp_queue *q)
{
	int32_t id = q->blocks[q->head].next;
	return id == q->tail ? -1 : id;
}

int32_t
kvp_queue_next(const struct kvp_queue *q, int32_t id)
{
	int32_t nx = q->blocks[id].next;
	return nx == q->tail ? -1 : nx;
}
