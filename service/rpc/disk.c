/* SPDX-License-Identifier: Apache-2.0 */
/* A region pool's disk tier: disk.h. */
#define _GNU_SOURCE /* O_DIRECT */
#include "service/rpc/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/pool.h"
#include "gpu/executor.h"
#include "service/rpc/dispatch.h"
#include "service/rpc/disk_io.h"
#include "service/rpc/fill.h"
#include "service/rpc/keep.h"

/*
 * Rows a round moves; an idle thread's sleep unless a commit or a lookup wakes
 * it; the longest key (a 64-byte hash); lookups waiting on the disk at once,
 * and how long a key it failed to serve misses after. Its events' medium is
 * vLLM 0.33's for its own disk tier (kv_offload's Medium.STORAGE).
 */
enum { BATCH = 32, IDLE_MS = 500, MAX_KEY = 64 + KVP_MAP_KEY_GROUP_LEN, FILL_WANTS = 4096,
       FILL_MISS_MS = 1000 };
#define DISK_MEDIUM "STORAGE"

/*
 * PATH.slots: a header, then a record per slot (the key its bytes are, their
 * CRC32C, a generation, and the record's own CRC32C), so a restart finds the
 * disk's rows again. A record is cleared before its slot is rewritten and
 * written after the bytes are: a kill leaves each either whole and true, or
 * refused. Bytes are checked against their CRC32C at every read anyway.
 */
#define SLOTS_MAGIC "KVPDISK1"
enum { SLOTS_VERSION = 1, SLOTS_HEADER = 4096, SLOTS_LAYOUT = 256 };

struct slots_header {
	char magic[8];
	uint32_t version, slots, key_len, rec_bytes;
	uint64_t stride, row_bytes;
	char layout[SLOTS_LAYOUT];
	uint32_t crc;
};

struct slot_rec {
	uint64_t gen; /* 0: empty */
	uint32_t crc;
	uint16_t key_len, pad;
	uint8_t key[MAX_KEY];
	uint32_t rec_crc; /* of everything above */
};

/* A committed row waiting to be written behind. */
struct wq_item {
	int32_t id;
	uint8_t key[MAX_KEY];
};

struct kvpd_disk {
	struct kvpd_pool *p;
	bool direct;
	uint32_t slots, hand;       /* hand: the next slot written, first in first out */
	size_t key_len;
	unsigned char *base;        /* the region's rows */
	/* Per slot: its key (key_len bytes), its bytes' CRC32C, used, busy (an I/O on it). */
	uint8_t *slot_keys;
	uint32_t *slot_crc;
	uint8_t *slot_used, *slot_busy;
	/* key -> slot + 1, open addressing with linear probing (capacity a power of two). */
	uint32_t *index;
	uint32_t index_mask;
	/* Committed rows to write behind: a ring. */
	struct wq_item *wq;
	uint32_t wq_cap, wq_head, wq_len;
	/*
	 * The disk's own fill table (fill.h): lookups of keys it holds wait
	 * here, never on the cluster tier's (a pool may have both), and its
	 * thread is their only agent.
	 */
	struct kvpd_fill fill;
	/* Keys the fill table wanted that the disk does not hold: reported absent next round. */
	uint8_t *absent;
	size_t n_absent;
	struct kvpd_disk_stats st;
	struct slot_rec *recs; /* PATH.slots, mapped: recs[s] is slot s's */
	size_t recs_map_bytes;
	unsigned char *recs_map;
	uint64_t next_gen;
	uint64_t epoch;        /* a Reset's count: I/O begun before one is not applied */
	/* Keys written or dropped since the last announcement (told in order, under the lock). */
	uint8_t *told;
	size_t n_told;
	bool told_stored;
	nng_cv *cv;            /* on the pool's lock: a commit or a pending lookup wakes the thread */
	bool kicked;
	struct kvpd_disk_io io; /* the file (fd), its rows' stride and checked bytes, its I/O */
	pthread_t thread;
	bool started;
	atomic_bool stop;
};

static uint64_t
key_hash(const uint8_t *k, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ k[i]) * 1099511628211ull;
	return h;
}

static const uint8_t *
slot_key(const struct kvpd_disk *d, uint32_t s)
{
	return d->slot_keys + (size_t)s * d->key_len;
}

/* The index position of key, or of the empty entry where it would go. */
static uint32_t
index_pos(const struct kvpd_disk *d, const uint8_t *key)
{
	uint32_t i = (uint32_t)key_hash(key, d->key_len) & d->index_mask;
	while (d->index[i] != 0 && memcmp(slot_key(d, d->index[i] - 1), key, d->key_len) != 0)
		i = (i + 1) & d->index_mask;
	return i;
}

static int64_t
index_find(const struct kvpd_disk *d, const uint8_t *key)
{
	uint32_t i = index_pos(d, key);
	return d->index[i] ? (int64_t)d->index[i] - 1 : -1;
}

/* Removes slot s's key from the index (backward-shift deletion: no tombstones). */
static void
index_remove(struct kvpd_disk *d, uint32_t s)
{
	uint32_t i = index_pos(d, slot_key(d, s));
	if (d->index[i] != s + 1)
		return;
	d->index[i] = 0;
	for (uint32_t j = (i + 1) & d->index_mask; d->index[j] != 0; j = (j + 1) & d->index_mask) {
		uint32_t home = (uint32_t)key_hash(slot_key(d, d->index[j] - 1), d->key_len) &
		                d->index_mask;
		/* Entry j may move to the hole at i if its home is not in (i, j]. */
		if (((j - home) & d->index_mask) >= ((j - i) & d->index_mask)) {
			d->index[i] = d->index[j];
			d->index[j] = 0;
			i = j;
		}
	}
}

static uint32_t
rec_crc_of(const struct slot_rec *r)
{
	return kvp_crc32c(0, r, offsetof(struct slot_rec, rec_crc));
}

/* The keys told so far go out as events (one kind at a time, in order). Under the lock. */
static void
tell_flush(struct kvpd_disk *d)
{
	struct kvpd_pool *p = d->p;
	uint32_t bs[KVP_MAX_GROUPS];
	if (d->n_told == 0)
		return;
	for (uint32_t g = 0; g < p->cfg.num_groups; g++)
		bs[g] = p->cfg.groups[g].block_size;
	/* Out of memory for events: the keys go untold, as a pool's own would. */
	(void)kvp_pool_announce(p->pool, d->told_stored, d->told, d->key_len, d->n_told,
	                        DISK_MEDIUM, bs, p->cfg.num_groups);
	d->n_told = 0;
}

/* Key now on disk (stored) or gone from it: told with the next flush. Under the lock. */
static void
tell(struct kvpd_disk *d, const uint8_t *key, bool stored)
{
	if (d->told == NULL)
		return; /* opening: what the disk holds is told once it is open */
	if (d->n_told == BATCH || (d->n_told > 0 && d->told_stored != stored))
		tell_flush(d);
	d->told_stored = stored;
	memcpy(d->told + d->n_told++ * d->key_len, key, d->key_len);
}

/* Frees slot s (its key leaves the index, its record is cleared, a removal is told). */
static void
slot_free(struct kvpd_disk *d, uint32_t s)
{
	d->recs[s].gen = 0;
	if (d->slot_used[s]) {
		tell(d, slot_key(d, s), false);
		index_remove(d, s);
		d->slot_used[s] = 0;
		d->st.used--;
	}
}

/* Slot s now holds key with crc; an older slot of the same key is freed. */
static void
slot_set(struct kvpd_disk *d, uint32_t s, const uint8_t *key, uint32_t crc)
{
	int64_t old = index_find(d, key);
	if (old >= 0)
		slot_free(d, (uint32_t)old);
	memcpy(d->slot_keys + (size_t)s * d->key_len, key, d->key_len);
	d->slot_crc[s] = crc;
	d->slot_used[s] = 1;
	d->st.used++;
	d->index[index_pos(d, key)] = s + 1;
	tell(d, key, true);
	struct slot_rec *r = &d->recs[s];
	r->gen = 0;
	r->crc = crc;
	r->key_len = (uint16_t)d->key_len;
	r->pad = 0;
	memset(r->key, 0, sizeof(r->key));
	memcpy(r->key, key, d->key_len);
	r->gen = d->next_gen++;
	r->rec_crc = rec_crc_of(r);
}

/* The row key is cached in, or -1. */
static int32_t
cached_row(struct kvpd_disk *d, const uint8_t *key)
{
	size_t hl = d->key_len - KVP_MAP_KEY_GROUP_LEN;
	uint32_t g = kvp_map_key_group(key, d->key_len);
	int32_t id = -1;
	return kvp_pool_get_cached_block(d->p->pool, key, hl, &g, 1, &id) == KVP_OK ? id : -1;
}

static unsigned char *
row(const struct kvpd_disk *d, int32_t id)
{
	return d->base + (uint64_t)id * d->io.stride;
}

void
kvpd_disk_kick(struct kvpd_disk *d)
{
	if (d == NULL || d->kicked)
		return;
	d->kicked = true;
	nng_cv_wake1(d->cv);
}

void
kvpd_disk_commit(struct kvpd_disk *d, int32_t id, const uint8_t *key, size_t key_len)
{
	if (d == NULL || key_len != d->key_len)
		return;
	if (d->wq_len == d->wq_cap) {
		d->st.write_skips++; /* writes fall behind commits: this one stays in memory only */
		return;
	}
	struct wq_item *w = &d->wq[(d->wq_head + d->wq_len++) % d->wq_cap];
	w->id = id;
	memcpy(w->key, key, key_len);
	kvpd_fill_forget(&d->fill, key); /* after its next eviction a lookup asks afresh */
	kvpd_disk_kick(d);
}

/* What a round's I/O changed goes out to the streams now. Under the lock. */
static void
publish(struct kvpd_disk *d)
{
	tell_flush(d);
	kvpd_pool_publish(d->p);
}

/* Writes behind up to BATCH committed rows; returns how many it took. */
static size_t
write_round(struct kvpd_disk *d)
{
	struct {
		int32_t id;
		uint32_t slot, crc;
		uint8_t key[MAX_KEY];
	} b[BATCH];
	struct kvpd_io_op ops[BATCH];
	size_t n = 0, taken = 0;
	struct kvpd_pool *p = d->p;

	nng_mtx_lock(p->lock);
	uint64_t epoch = d->epoch;
	while (n < BATCH && d->wq_len > 0) {
		struct wq_item *w = &d->wq[d->wq_head];
		d->wq_head = (d->wq_head + 1) % d->wq_cap;
		d->wq_len--;
		taken++;
		if (cached_row(d, w->key) != w->id || index_find(d, w->key) >= 0)
			continue; /* gone already, or on disk already */
		uint32_t s = d->hand, tries = 0;
		while (d->slot_busy[s] && tries++ < d->slots)
			s = (s + 1) % d->slots;
		if (d->slot_busy[s])
			break;
		d->hand = (s + 1) % d->slots;
		slot_free(d, s);
		d->slot_busy[s] = 1;
		b[n].id = w->id;
		b[n].slot = s;
		b[n].crc = p->row_crc[w->id]; /* the commit's, if it took one */
		memcpy(b[n].key, w->key, d->key_len);
		n++;
	}
	if (n > 0)
		publish(d); /* the slots' earlier keys are gone */
	nng_mtx_unlock(p->lock);
	/* Outside the lock: a row reused meanwhile no longer holds its key, checked below. */
	for (size_t i = 0; i < n; i++) {
		if (b[i].crc == 0)
			b[i].crc = kvp_crc32c(0, row(d, b[i].id), d->io.row_bytes);
		ops[i] = (struct kvpd_io_op){.buf = row(d, b[i].id), .off = (uint64_t)b[i].slot * d->io.stride};
	}
	kvpd_disk_io_batch(&d->io, ops, n, true);
	nng_mtx_lock(p->lock);
	for (size_t i = 0; i < n; i++) {
		d->slot_busy[b[i].slot] = 0;
		if (!ops[i].ok)
			d->st.io_errors++;
		else if (epoch != d->epoch || cached_row(d, b[i].key) != b[i].id)
			d->st.write_skips++; /* reset, or the row changed: its bytes may not be the key's */
		else {
			slot_set(d, b[i].slot, b[i].key, b[i].crc);
			d->st.writes++;
		}
	}
	if (n > 0)
		publish(d);
	nng_mtx_unlock(p->lock);
	return taken;
}

/* Fills up to BATCH keys lookups wanted; returns how many it was asked for. */
static size_t
fill_round(struct kvpd_disk *d)
{
	struct {
		int32_t id;
		uint32_t slot;
	} b[BATCH];
	struct kvpd_io_op ops[BATCH];
	uint8_t want[BATCH * MAX_KEY];
	uint32_t waiting = 0, bs[KVP_MAX_GROUPS];
	size_t n = 0;
	struct kvpd_pool *p = d->p;

	nng_mtx_lock(p->lock);
	uint64_t epoch = d->epoch;
	size_t asked = kvpd_fill_agent(&d->fill, d->absent, d->n_absent, want, BATCH, &waiting,
	                               nng_clock());
	d->n_absent = 0;
	for (size_t i = 0; i < asked; i++) {
		const uint8_t *k = want + i * d->key_len;
		int64_t s = index_find(d, k);
		int32_t id = -1;
		if (s < 0 || d->slot_busy[s]) {
			memcpy(d->absent + d->n_absent++ * d->key_len, k, d->key_len);
			continue;
		}
		if (cached_row(d, k) > 0 ||
		    kvp_pool_reserve(p->pool, k, d->key_len, 1, &id, NULL, NULL) != KVP_OK || id <= 0)
			continue; /* cached meanwhile, being stored, or no room: the lookup asks again */
		d->slot_busy[s] = 1;
		b[n].id = id;
		b[n].slot = (uint32_t)s;
		ops[n] = (struct kvpd_io_op){.buf = row(d, id), .off = (uint64_t)s * d->io.stride,
		                        .crc = d->slot_crc[s]};
		n++;
	}
	if (n > 0)
		publish(d); /* the reserve's evictions */
	nng_mtx_unlock(p->lock);
	/* Outside the lock: the reserved rows are this thread's until they commit or abort. */
	kvpd_disk_io_batch(&d->io, ops, n, false);
	nng_mtx_lock(p->lock);
	for (uint32_t g = 0; g < p->cfg.num_groups; g++)
		bs[g] = p->cfg.groups[g].block_size;
	for (size_t i = 0; i < n; i++) {
		d->slot_busy[b[i].slot] = 0;
		if (ops[i].ok && epoch == d->epoch &&
		    kvp_pool_commit(p->pool, &b[i].id, 1, bs, p->cfg.num_groups) == KVP_OK) {
			p->row_crc[b[i].id] = ops[i].crc;
			p->row_hits[b[i].id] = 0;
			kvpd_keep_commit(p->keep, b[i].id, slot_key(d, b[i].slot), d->key_len, ops[i].crc);
			kvpd_fill_forget(&d->fill, slot_key(d, b[i].slot));
			kvpd_fill_forget(&p->fill, slot_key(d, b[i].slot));
			d->st.fills++;
			continue;
		}
		(void)kvp_pool_abort(p->pool, &b[i].id, 1);
		if (epoch != d->epoch)
			continue; /* a reset emptied the disk meanwhile */
		d->st.fill_failures++;
		slot_free(d, b[i].slot); /* bytes that fail their check are never read again */
	}
	if (n > 0)
		publish(d);
	nng_mtx_unlock(p->lock);
	return asked;
}

static void *
disk_main(void *arg)
{
	struct kvpd_disk *d = arg;
	while (!atomic_load(&d->stop)) {
		if (write_round(d) + fill_round(d) > 0)
			continue;
		/* Idle: until a commit or a pending lookup wakes it, or a round is due. */
		nng_mtx_lock(d->p->lock);
		if (!d->kicked && !atomic_load(&d->stop))
			(void)nng_cv_until(d->cv, nng_clock() + IDLE_MS);
		d->kicked = false;
		nng_mtx_unlock(d->p->lock);
	}
	return NULL;
}

void
kvpd_disk_reset(struct kvpd_disk *d)
{
	if (d == NULL)
		return;
	/* Untold: the reset's AllBlocksCleared says it for every medium. A slot
	 * being read stays busy (no write takes it) until its read is reaped. */
	uint8_t *told = d->told;
	d->told = NULL;
	for (uint32_t s = 0; s < d->slots; s++)
		slot_free(d, s);
	d->told = told;
	d->n_told = d->wq_len = 0;
	d->n_absent = 0;
	d->epoch++;
}

void
kvpd_disk_stats(const struct kvpd_disk *d, struct kvpd_disk_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (d == NULL)
		return;
	*out = d->st;
	out->slots = d->slots;
	out->direct = d->direct;
	out->uring = d->io.uring;
}

void
kvpd_disk_close(struct kvpd_disk *d)
{
	if (d == NULL)
		return;
	if (d->started) {
		atomic_store(&d->stop, true);
		nng_mtx_lock(d->p->lock);
		nng_cv_wake(d->cv);
		nng_mtx_unlock(d->p->lock);
		pthread_join(d->thread, NULL);
	}
	kvpd_disk_io_fini(&d->io);
	if (d->cv != NULL)
		nng_cv_free(d->cv);
	kvpd_fill_fini(&d->fill);
	free(d->told);
	if (d->io.fd >= 0)
		close(d->io.fd);
	if (d->recs_map != NULL)
		munmap(d->recs_map, d->recs_map_bytes);
	free(d->slot_keys);
	free(d->slot_crc);
	free(d->slot_used);
	free(d->slot_busy);
	free(d->index);
	free(d->wq);
	free(d->absent);
	free(d);
}

/*
 * Opens PATH.slots and, unless fresh, indexes the slots an earlier life
 * recorded (a record written under another layout or torn is not read;
 * of two records of one key the newer wins); else clears it.
 */
static int
slots_open(struct kvpd_disk *d, const char *path, uint32_t mode, bool fresh, char *err,
           size_t err_len)
{
	char sp[4096 + 8];
	struct slots_header want;
	struct stat st;
	int fd;

	if ((size_t)snprintf(sp, sizeof(sp), "%s.slots", path) >= sizeof(sp)) {
		snprintf(err, err_len, "pool %s: the disk tier's path is too long", d->p->cfg.name);
		return KVP_EINVAL;
	}
	d->recs_map_bytes = SLOTS_HEADER + (size_t)d->slots * sizeof(struct slot_rec);
	if ((fd = open(sp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode & 0777)) < 0 ||
	    fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		snprintf(err, err_len, "pool %s: %.160s: cannot open it as a regular file of this "
		         "user", d->p->cfg.name, sp);
		if (fd >= 0)
			close(fd);
		return KVP_EINVAL;
	}
	memset(&want, 0, sizeof(want));
	memcpy(want.magic, SLOTS_MAGIC, sizeof(want.magic));
	want.version = SLOTS_VERSION;
	want.slots = d->slots;
	want.key_len = (uint32_t)d->key_len;
	want.rec_bytes = sizeof(struct slot_rec);
	want.stride = d->io.stride;
	want.row_bytes = d->io.row_bytes;
	kvpd_keep_layout(&d->p->cfg, want.layout, sizeof(want.layout));
	want.crc = kvp_crc32c(0, &want, offsetof(struct slots_header, crc));
	fresh = fresh || (uint64_t)st.st_size != d->recs_map_bytes;
	if (fresh && (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)d->recs_map_bytes) != 0)) {
		snprintf(err, err_len, "pool %s: cannot size %.160s", d->p->cfg.name, sp);
		close(fd);
		return KVP_ENOMEM;
	}
	d->recs_map = mmap(NULL, d->recs_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (d->recs_map == MAP_FAILED) {
		d->recs_map = NULL;
		snprintf(err, err_len, "pool %s: cannot map %.160s", d->p->cfg.name, sp);
		return KVP_ENOMEM;
	}
	d->recs = (struct slot_rec *)(d->recs_map + SLOTS_HEADER);
	d->next_gen = 1;
	if (fresh || memcmp(d->recs_map, &want, sizeof(want)) != 0) {
		memset(d->recs_map + SLOTS_HEADER, 0, d->recs_map_bytes - SLOTS_HEADER);
		memcpy(d->recs_map, &want, sizeof(want));
		return KVP_OK;
	}
	uint64_t newest = 0;
	for (uint32_t s = 0; s < d->slots; s++) {
		struct slot_rec *r = &d->recs[s];
		if (r->gen == 0)
			continue;
		if (r->key_len != d->key_len || r->rec_crc != rec_crc_of(r)) {
			r->gen = 0;
			continue;
		}
		int64_t other = index_find(d, r->key);
		if (other >= 0 && d->recs[other].gen > r->gen) {
			r->gen = 0;
			continue;
		}
		uint64_t gen = r->gen;
		if (d->next_gen <= gen)
			d->next_gen = gen + 1;
		slot_set(d, s, r->key, r->crc); /* frees the older slot of the same key */
		d->recs[s].gen = gen;
		d->recs[s].rec_crc = rec_crc_of(&d->recs[s]);
		if (gen > newest) {
			newest = gen;
			d->hand = (s + 1) % d->slots;
		}
	}
	d->next_gen = d->next_gen > newest ? d->next_gen : newest + 1;
	return KVP_OK;
}

int
kvpd_disk_open(struct kvpd_pool *p, const char *path, uint32_t rows, uint32_t mode, char *err,
               size_t err_len)
{
	struct kvp_exec_region reg;
	struct kvpd_disk *d;
	int rv;

	if (p == NULL || path == NULL || rows == 0 || p->row_crc == NULL ||
	    kvp_exec_region(p->exec, &reg) != KVP_OK) {
		snprintf(err, err_len, "pool %s: a disk tier needs a shared region",
		         p ? p->cfg.name : "?");
		return KVP_EINVAL;
	}
	if ((d = calloc(1, sizeof(*d))) == NULL)
		goto nomem;
	d->p = p;
	d->io.fd = -1;
	d->slots = rows;
	d->key_len = kvp_pool_hash_len(p->pool) + KVP_MAP_KEY_GROUP_LEN;
	d->io.stride = reg.row_stride;
	d->io.row_bytes = reg.row_bytes;
	d->base = reg.base;
	d->wq_cap = reg.num_rows;
	uint32_t cap = 2;
	while (cap < 2 * rows)
		cap *= 2;
	d->index_mask = cap - 1;
	if (d->key_len > MAX_KEY ||
	    (d->slot_keys = calloc(rows, d->key_len)) == NULL ||
	    (d->slot_crc = calloc(rows, sizeof(*d->slot_crc))) == NULL ||
	    (d->slot_used = calloc(rows, 1)) == NULL || (d->slot_busy = calloc(rows, 1)) == NULL ||
	    (d->index = calloc(cap, sizeof(*d->index))) == NULL ||
	    (d->wq = calloc(d->wq_cap, sizeof(*d->wq))) == NULL ||
	    (d->absent = calloc(BATCH, d->key_len)) == NULL || nng_cv_alloc(&d->cv, p->lock) != 0 ||
	    kvpd_fill_init(&d->fill, d->key_len, FILL_WANTS, KVPD_DISK_WAIT_MS, FILL_MISS_MS) != KVP_OK)
		goto nomem;
	/* O_DIRECT where rows are whole pages and the file system takes it (tmpfs does not). */
	int flags = O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW;
	if (d->io.stride % 4096 == 0 && (d->io.fd = open(path, flags | O_DIRECT, mode & 0777)) >= 0)
		d->direct = true;
	else if ((d->io.fd = open(path, flags, mode & 0777)) < 0) {
		snprintf(err, err_len, "pool %s: cannot open the disk tier %.160s: %s", p->cfg.name,
		         path, strerror(errno));
		kvpd_disk_close(d);
		return KVP_EINVAL;
	}
	struct stat st;
	if (flock(d->io.fd, LOCK_EX | LOCK_NB) != 0) {
		snprintf(err, err_len, "pool %s: the disk tier %.160s is held by another pool or "
		         "process", p->cfg.name, path);
		kvpd_disk_close(d);
		return KVP_EINVAL;
	}
	if (fstat(d->io.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		snprintf(err, err_len, "pool %s: the disk tier %.160s is not a regular file of this "
		         "user", p->cfg.name, path);
		kvpd_disk_close(d);
		return KVP_EINVAL;
	}
	bool fresh = (uint64_t)st.st_size != d->io.stride * rows;
	if ((rv = slots_open(d, path, mode, fresh, err, err_len)) != KVP_OK) {
		kvpd_disk_close(d);
		return rv;
	}
	/* A file of another size, or whose slots say nothing, starts empty. */
	if (d->st.used == 0 && (ftruncate(d->io.fd, 0) != 0 ||
	                        (rv = posix_fallocate(d->io.fd, 0, (off_t)(d->io.stride * rows))) != 0)) {
		snprintf(err, err_len, "pool %s: cannot allocate %llu bytes for the disk tier "
		         "%.160s", p->cfg.name, (unsigned long long)(d->io.stride * rows), path);
		kvpd_disk_close(d);
		return KVP_ENOMEM;
	}
	/* What the disk holds from an earlier life is told after the pool's own start events. */
	if ((d->told = calloc(BATCH, d->key_len)) == NULL)
		goto nomem;
	for (uint32_t s = 0; s < d->slots; s++)
		if (d->slot_used[s])
			tell(d, slot_key(d, s), true);
	tell_flush(d);
	kvpd_disk_io_init(&d->io, BATCH);
	if (pthread_create(&d->thread, NULL, disk_main, d) != 0) {
		snprintf(err, err_len, "pool %s: cannot start the disk tier's thread", p->cfg.name);
		kvpd_disk_close(d);
		return KVP_ENOMEM;
	}
	d->started = true;
	p->disk = d;
	size_t used = strlen(p->exec_note);
	if (used < sizeof(p->exec_note))
		(void)snprintf(p->exec_note + used, sizeof(p->exec_note) - used,
		               ", disk tier %u rows (%s, %s, %llu kept)", rows,
		               d->io.uring ? "io_uring" : "pread/pwrite",
		               d->direct ? "O_DIRECT" : "page cache", (unsigned long long)d->st.used);
	return KVP_OK;
nomem:
	snprintf(err, err_len, "pool %s: out of memory for the disk tier", p->cfg.name);
	kvpd_disk_close(d);
	return KVP_ENOMEM;
}

/* Whether the disk holds key (a lookup's miss then waits on a fill). Under the pool's lock. */
bool
kvpd_disk_has(const struct kvpd_disk *d, const uint8_t *key, size_t key_len)
{
	return d != NULL && key_len == d->key_len && index_find(d, key) >= 0;
}

bool
kvpd_disk_ask(struct kvpd_disk *d, const uint8_t *key, size_t key_len, uint64_t now_ms)
{
	if (!kvpd_disk_has(d, key, key_len) ||
	    kvpd_fill_ask(&d->fill, key, now_ms) != KVPD_FILL_PENDING)
		return false;
	kvpd_disk_kick(d);
	return true;
}
