/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's committed rows kept across lives: keep.h. */
#define _GNU_SOURCE /* O_NOFOLLOW, O_CLOEXEC */
#include "service/rpc/keep.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/block_hash.h"
#include "common/crc32c.h"
#include "common/kvp_status.h"
#include "common/map_key.h"
#include "engine/pool.h"
#include "gpu/executor.h"
#include "service/rpc/dispatch.h"

#define KEEP_MAGIC "KVPROWS1"
enum { KEEP_VERSION = 1, HEADER_BYTES = 4096, LAYOUT_MAX = 256 };

/* The file's first HEADER_BYTES: what every record below assumes. */
struct header {
	char magic[8];
	uint32_t version, num_rows, key_len, rec_bytes;
	uint64_t row_bytes, row_stride;
	char layout[LAYOUT_MAX];
	uint32_t crc; /* of everything above */
};

/* A record: gen, then crc, key_len, flags, the key, and the record's CRC32C last. */
struct rec {
	uint64_t gen; /* 0: no row */
	uint32_t crc;
	uint16_t key_len, flags;
	uint8_t key[];
};

/* The commit carried no CRC: the sweeper has yet to take one (until then, not proven). */
#define REC_UNSWEPT 1u

/* What a start found, for the log. */
struct kvpd_keep_report {
	uint32_t adopted;    /* rows cached again */
	uint32_t dropped;    /* records refused: torn, or their row's bytes changed */
	uint32_t unproven;   /* committed without a CRC, none taken yet: dropped */
	uint64_t checked_bytes;
	double seconds;      /* to check and adopt */
	char cold_why[160];  /* "" when an earlier life's rows were read; else why not */
};

struct kvpd_keep {
	unsigned char *map;
	size_t map_bytes;
	uint32_t num_rows, key_len, rec_bytes;
	uint64_t next_gen;
	/* The region's rows, for the sweeper. */
	const unsigned char *base;
	uint64_t row_bytes, row_stride;
	/* Rows committed without a CRC, oldest first: a ring of num_rows ids. */
	int32_t *unswept;
	uint32_t us_head, us_len;
	uint8_t *queued;  /* per row: in the ring */
	uint64_t swept;   /* rows proven by the sweeper */
	uint32_t kept, dropped; /* at this life's start */
};

void
kvpd_keep_stats(const struct kvpd_keep *k, struct kvpd_keep_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (k == NULL)
		return;
	out->kept = k->kept;
	out->dropped = k->dropped;
	out->unproven = k->us_len;
	out->proven = k->swept;
}

static struct rec *
rec_at(const struct kvpd_keep *k, int32_t id)
{
	return (struct rec *)(k->map + HEADER_BYTES + (size_t)id * k->rec_bytes);
}

static uint32_t *
rec_crc(const struct kvpd_keep *k, struct rec *r)
{
	return (uint32_t *)((unsigned char *)r + k->rec_bytes - sizeof(uint32_t));
}

static bool
rec_ok(const struct kvpd_keep *k, struct rec *r)
{
	return r->gen != 0 && r->key_len == k->key_len && r->flags == 0 &&
	       *rec_crc(k, r) == kvp_crc32c(0, r, k->rec_bytes - sizeof(uint32_t));
}

void
kvpd_keep_commit(struct kvpd_keep *k, int32_t id, const uint8_t *key, size_t key_len,
                 uint32_t crc)
{
	if (k == NULL || id <= 0 || (uint32_t)id >= k->num_rows || key_len != k->key_len)
		return;
	struct rec *r = rec_at(k, id);
	r->gen = 0; /* a kill from here to the checksum leaves a record that fails it */
	r->crc = crc;
	r->key_len = (uint16_t)key_len;
	r->flags = crc == 0 ? REC_UNSWEPT : 0;
	memcpy(r->key, key, key_len);
	r->gen = k->next_gen++;
	*rec_crc(k, r) = kvp_crc32c(0, r, k->rec_bytes - sizeof(uint32_t));
	if (crc == 0 && !k->queued[id]) { /* the ring has room for every row once */
		k->unswept[(k->us_head + k->us_len++) % k->num_rows] = id;
		k->queued[id] = 1;
	}
}

/* At most SWEEP_ROWS rows a round, so the lock is held for a bounded scan only. */
enum { SWEEP_ROWS = 64 };

uint64_t
kvpd_keep_sweep(struct kvpd_pool *p, uint64_t max_bytes)
{
	struct kvpd_keep *k = p ? p->keep : NULL;
	int32_t ids[SWEEP_ROWS];
	uint64_t gens[SWEEP_ROWS], done = 0;
	uint32_t crcs[SWEEP_ROWS];

	while (k != NULL && done < max_bytes) {
		size_t n = 0;
		nng_mtx_lock(p->lock);
		while (n < SWEEP_ROWS && k->us_len > 0) {
			int32_t id = k->unswept[k->us_head];
			k->us_head = (k->us_head + 1) % k->num_rows;
			k->us_len--;
			k->queued[id] = 0;
			struct rec *r = rec_at(k, id);
			if (r->gen != 0 && (r->flags & REC_UNSWEPT)) {
				ids[n] = id;
				gens[n++] = r->gen;
			}
		}
		nng_mtx_unlock(p->lock);
		if (n == 0)
			break;
		/* Outside the lock: a row reused meanwhile changes its record's gen, checked below. */
		for (size_t i = 0; i < n; i++)
			crcs[i] = kvp_crc32c(0, k->base + (uint64_t)ids[i] * k->row_stride, k->row_bytes);
		nng_mtx_lock(p->lock);
		for (size_t i = 0; i < n; i++) {
			struct rec *r = rec_at(k, ids[i]);
			if (r->gen != gens[i] || !(r->flags & REC_UNSWEPT))
				continue;
			r->gen = 0;
			r->crc = crcs[i];
			r->flags = 0;
			r->gen = gens[i];
			*rec_crc(k, r) = kvp_crc32c(0, r, k->rec_bytes - sizeof(uint32_t));
			k->swept++;
		}
		nng_mtx_unlock(p->lock);
		done += (uint64_t)n * k->row_bytes;
	}
	return done;
}

/* The pool's unkey hook: the key leaves the cache, so its record goes first. */
static void
unkey(void *ctx, int32_t id)
{
	struct kvpd_keep *k = ctx;
	if (id < 0) {
		for (uint32_t i = 1; i < k->num_rows; i++)
			rec_at(k, (int32_t)i)->gen = 0;
	} else if ((uint32_t)id < k->num_rows) {
		rec_at(k, id)->gen = 0;
	}
}

void
kvpd_keep_close(struct kvpd_keep *k)
{
	if (k == NULL)
		return;
	if (k->map != NULL)
		munmap(k->map, k->map_bytes);
	free(k->unswept);
	free(k->queued);
	free(k);
}

static void
header_fill(struct header *h, const struct kvpd_keep *k, const struct kvp_exec_region *reg,
            const char *layout)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, KEEP_MAGIC, sizeof(h->magic));
	h->version = KEEP_VERSION;
	h->num_rows = k->num_rows;
	h->key_len = k->key_len;
	h->rec_bytes = k->rec_bytes;
	h->row_bytes = reg->row_bytes;
	h->row_stride = reg->row_stride;
	snprintf(h->layout, sizeof(h->layout), "%s", layout);
	h->crc = kvp_crc32c(0, h, offsetof(struct header, crc));
}

static int
cmp_gen(const void *a, const void *b, void *arg)
{
	const struct kvpd_keep *k = arg;
	uint64_t x = rec_at(k, *(const int32_t *)a)->gen, y = rec_at(k, *(const int32_t *)b)->gen;
	return (x > y) - (x < y);
}

/* One checking thread's share: rows ids[i] for i = first, first + step, ... */
struct check_share {
	const struct kvpd_keep *k;
	const int32_t *ids;
	size_t n, first, step;
};

static void *
check_share_main(void *arg)
{
	const struct check_share *s = arg;
	for (size_t i = s->first; i < s->n; i += s->step) {
		struct rec *r = rec_at(s->k, s->ids[i]);
		if (kvp_crc32c(0, s->k->base + (uint64_t)s->ids[i] * s->k->row_stride,
		               s->k->row_bytes) != r->crc)
			r->gen = 0; /* torn, or written after its commit: dropped */
	}
	return NULL;
}

/*
 * Checks rows ids[0..n) against their records' CRC32C, clearing the record
 * of each that fails: on up to KEEP_CHECK_THREADS threads (one per online
 * CPU), since a start reads every byte of the region (the caller's thread
 * alone where none can be started).
 */
enum { KEEP_CHECK_THREADS = 16 };

static void
check_rows(const struct kvpd_keep *k, const int32_t *ids, size_t n)
{
	pthread_t th[KEEP_CHECK_THREADS];
	struct check_share sh[KEEP_CHECK_THREADS];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = cpus < 1 ? 1 : cpus > KEEP_CHECK_THREADS ? KEEP_CHECK_THREADS : (size_t)cpus;
	size_t started = 0;

	if (want > n)
		want = n ? n : 1;
	for (size_t t = 0; t < want; t++)
		sh[t] = (struct check_share){.k = k, .ids = ids, .n = n, .first = t, .step = want};
	for (size_t t = 1; t < want; t++) {
		if (pthread_create(&th[t], NULL, check_share_main, &sh[t]) != 0)
			break;
		started = t;
	}
	/* Shares whose thread did not start run here, after the caller's own. */
	(void)check_share_main(&sh[0]);
	for (size_t t = started + 1; t < want; t++)
		(void)check_share_main(&sh[t]);
	for (size_t t = 1; t <= started; t++)
		pthread_join(th[t], NULL);
}

/* Adopts the rows whose records and bytes agree; fills rep. */
static int
adopt(struct kvpd_pool *p, struct kvpd_keep *k, const struct kvp_exec_region *reg,
      struct kvpd_keep_report *rep)
{
	int32_t *ids = malloc(((size_t)k->num_rows + 1) * sizeof(*ids));
	uint8_t *keys = malloc(((size_t)k->num_rows + 1) * k->key_len);
	uint32_t bs[KVP_MAX_GROUPS];
	size_t n = 0;
	int rv = KVP_OK;

	if (ids == NULL || keys == NULL) {
		free(ids);
		free(keys);
		return KVP_ENOMEM;
	}
	for (uint32_t i = 1; i < k->num_rows; i++) {
		struct rec *r = rec_at(k, (int32_t)i);
		if (r->gen == 0)
			continue;
		if (k->next_gen <= r->gen)
			k->next_gen = r->gen + 1;
		if (r->flags & REC_UNSWEPT && *rec_crc(k, r) == kvp_crc32c(0, r, k->rec_bytes - 4)) {
			r->gen = 0; /* committed without a CRC, and killed before the sweeper took one */
			rep->unproven++;
			continue;
		}
		if (!rec_ok(k, r)) {
			r->gen = 0;
			rep->dropped++;
			continue;
		}
		ids[n++] = (int32_t)i;
	}
	/* Each candidate row's bytes against its recorded CRC32C, on several threads. */
	rep->checked_bytes = (uint64_t)n * reg->row_bytes;
	check_rows(k, ids, n);
	size_t whole = 0;
	for (size_t i = 0; i < n; i++) {
		if (rec_at(k, ids[i])->gen != 0)
			ids[whole++] = ids[i];
		else
			rep->dropped++;
	}
	n = whole;
	qsort_r(ids, n, sizeof(*ids), cmp_gen, k);
	for (size_t i = 0; i < n; i++)
		memcpy(keys + i * k->key_len, rec_at(k, ids[i])->key, k->key_len);
	for (uint32_t g = 0; g < p->cfg.num_groups; g++)
		bs[g] = p->cfg.groups[g].block_size;
	rv = kvp_pool_adopt(p->pool, keys, k->key_len, ids, n, bs, p->cfg.num_groups);
	if (rv == KVP_EINVAL || rv == KVP_ESTATE) {
		/* A key recorded twice (impossible while the hook runs): the newer wins, one by one. */
		size_t took = 0;
		for (size_t i = n; i-- > 0;) {
			if (kvp_pool_adopt(p->pool, keys + i * k->key_len, k->key_len, &ids[i], 1, bs,
			                   p->cfg.num_groups) == KVP_OK)
				ids[took++] = ids[i];
			else {
				rec_at(k, ids[i])->gen = 0;
				rep->dropped++;
			}
		}
		n = took;
		rv = KVP_OK;
	}
	if (rv == KVP_OK) {
		for (size_t i = 0; i < n; i++)
			p->row_crc[ids[i]] = rec_at(k, ids[i])->crc;
		rep->adopted = (uint32_t)n;
	}
	free(ids);
	free(keys);
	return rv;
}

void
kvpd_keep_layout(const struct kvpd_pool_config *pc, char *out, size_t len)
{
	snprintf(out, len, "block_size=%u layers=%u heads=%u head_size=%u dtype=%s layout=%s "
	         "hash_algo=%s hash_block_size=%u shards=%u vllm=%s", pc->block_size,
	         pc->exec.layers, pc->exec.heads, pc->exec.head_size, pc->exec.dtype,
	         pc->exec.layout, kvp_hash_algo_name(pc->hash_algo), pc->hash_block_size,
	         pc->shards ? pc->shards : 1, kvp_vllm_semantics_name(pc->vllm));
}

static void
note(struct kvpd_pool *p, const struct kvpd_keep_report *r)
{
	size_t used = strlen(p->exec_note);
	if (r->cold_why[0] != '\0')
		(void)snprintf(p->exec_note + used, sizeof(p->exec_note) - used,
		               ", restart=warm: started empty (%s)", r->cold_why);
	else
		(void)snprintf(p->exec_note + used, sizeof(p->exec_note) - used,
		               ", restart=warm: kept %u rows, dropped %u (torn or changed) and %u (no "
		               "checksum yet), checked %llu MiB in %.2f s",
		               r->adopted, r->dropped, r->unproven,
		               (unsigned long long)(r->checked_bytes >> 20), r->seconds);
}

int
kvpd_keep_open(struct kvpd_pool *p, uint32_t mode, char *err, size_t err_len)
{
	struct kvpd_keep_report report, *rep = &report;
	char layout[LAYOUT_MAX];
	struct kvp_exec_region reg;
	struct kvpd_keep *k;
	struct timespec t0, t1;
	struct stat st;
	char path[4096];
	int fd, rv;

	memset(rep, 0, sizeof(*rep));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	size_t pl;
	if (p == NULL || p->row_crc == NULL ||
	    kvp_exec_region(p->exec, &reg) != KVP_OK || (pl = strlen(reg.path)) < 7 ||
	    pl >= sizeof(path) || strcmp(reg.path + pl - 7, ".region") != 0) {
		snprintf(err, err_len, "pool %s: restart=warm needs a kept shared region",
		         p ? p->cfg.name : "?");
		return KVP_EINVAL;
	}
	memcpy(path, reg.path, pl - 7);
	memcpy(path + pl - 7, ".rows", 6);
	if ((k = calloc(1, sizeof(*k))) == NULL) {
		snprintf(err, err_len, "pool %s: out of memory", p->cfg.name);
		return KVP_ENOMEM;
	}
	k->num_rows = reg.num_rows;
	k->key_len = kvp_pool_hash_len(p->pool) + KVP_MAP_KEY_GROUP_LEN;
	k->rec_bytes = (uint32_t)((sizeof(struct rec) + k->key_len + sizeof(uint32_t) + 7) / 8 * 8);
	k->map_bytes = HEADER_BYTES + (size_t)k->num_rows * k->rec_bytes;
	k->next_gen = 1;
	k->base = reg.base;
	k->row_bytes = reg.row_bytes;
	k->row_stride = reg.row_stride;
	k->unswept = malloc((size_t)k->num_rows * sizeof(*k->unswept));
	k->queued = calloc(k->num_rows, 1);
	if (k->unswept == NULL || k->queued == NULL) {
		snprintf(err, err_len, "pool %s: out of memory", p->cfg.name);
		kvpd_keep_close(k);
		return KVP_ENOMEM;
	}
	/* The region's lock (flock on its file) keeps a second daemon off these records too. */
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)(mode & 0777))) < 0 ||
	    fstat(fd, &st) != 0) {
		snprintf(err, err_len, "pool %s: cannot open %.160s: %s", p->cfg.name, path, strerror(errno));
		if (fd >= 0)
			close(fd);
		kvpd_keep_close(k);
		return KVP_EINVAL;
	}
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		snprintf(err, err_len, "pool %s: %.160s is not a regular file of this user",
		         p->cfg.name, path);
		close(fd);
		kvpd_keep_close(k);
		return KVP_EINVAL;
	}
	struct header want, *have;
	kvpd_keep_layout(&p->cfg, layout, sizeof(layout));
	header_fill(&want, k, &reg, layout);
	bool fresh = !reg.kept || (uint64_t)st.st_size != k->map_bytes;
	if (!reg.kept)
		snprintf(rep->cold_why, sizeof(rep->cold_why), "no region from an earlier life");
	else if (fresh)
		snprintf(rep->cold_why, sizeof(rep->cold_why), "no records of its rows");
	if (fresh && (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)k->map_bytes) != 0)) {
		snprintf(err, err_len, "pool %s: cannot size %.160s: %s", p->cfg.name, path, strerror(errno));
		close(fd);
		kvpd_keep_close(k);
		return KVP_ENOMEM;
	}
	k->map = mmap(NULL, k->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (k->map == MAP_FAILED) {
		snprintf(err, err_len, "pool %s: cannot map %.160s: %s", p->cfg.name, path, strerror(errno));
		k->map = NULL;
		kvpd_keep_close(k);
		return KVP_ENOMEM;
	}
	have = (struct header *)k->map;
	if (!fresh && memcmp(have, &want, sizeof(want)) != 0) {
		snprintf(rep->cold_why, sizeof(rep->cold_why), "its rows were written in another "
		         "layout (was \"%.60s\")", have->crc == kvp_crc32c(0, have,
		         offsetof(struct header, crc)) ? have->layout : "unreadable");
		fresh = true;
	}
	if (fresh) {
		memset(k->map + HEADER_BYTES, 0, k->map_bytes - HEADER_BYTES);
		memcpy(have, &want, sizeof(want));
	}
	/* A restart says what it kept: the old life's blocks cleared, the kept ones stored. */
	if ((rv = kvp_pool_reset_prefix_cache(p->pool)) != KVP_OK ||
	    (!fresh && (rv = adopt(p, k, &reg, rep)) != KVP_OK)) {
		snprintf(err, err_len, "pool %s: adopting kept rows: %s", p->cfg.name, kvp_strerror(rv));
		kvpd_keep_close(k);
		return rv;
	}
	kvp_pool_set_unkey_hook(p->pool, unkey, k);
	p->keep = k;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	rep->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	k->kept = rep->adopted;
	k->dropped = rep->dropped + rep->unproven;
	note(p, rep);
	return KVP_OK;
}
