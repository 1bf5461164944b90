/* SPDX-License-Identifier: Apache-2.0 */
/* libkvpool's shared region: the pool's rows mapped here, and the calls by key. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clients/c/client_impl.h"
#include "common/crc32c.h"

struct kvp_region {
	struct kvp_region_info info;
	unsigned char *base;
	int fd; /* the file checked and mapped, kept for kvp_region_fd */
};

size_t
kvp_client_key_len(const struct kvp_client *c)
{
	return c ? (size_t)(c->info.hash_len ? c->info.hash_len : 32) + 4 : 0;
}

static int
no_region(struct kvp_client *c)
{
	if (!c->info.region)
		return kvp_client_fail_(c, KVP_ENOTSUP, "pool %s has no shared region", c->info.pool);
	return KVP_OK;
}

/* The shape the daemon gave must describe a file this size: a lying reply maps nothing. */
static bool
sane(const struct kvp_region_info *i, uint64_t file_size)
{
	return i->num_rows > 1 && i->row_bytes > 0 && i->row_stride >= i->row_bytes &&
	       i->row_stride <= i->bytes / i->num_rows && i->bytes == file_size &&
	       i->bytes <= SIZE_MAX && i->shards >= 1 && i->shard_bytes * i->shards == i->row_bytes;
}

/*
 * Whether the file's name is one kvpoold gives a region:
 * kvpool-<pool>-<pid>-<16 hex digits>, or kvpool-<pool>.region for a
 * region kept across restarts (restart=warm).
 */
static bool
region_name(const char *path)
{
	const char *b = strrchr(path, '/');
	b = b ? b + 1 : path;
	size_t n = strlen(b);
	if (strncmp(b, "kvpool-", 7) == 0 && n > 7 + 7 && strcmp(b + n - 7, ".region") == 0)
		return true;
	if (strncmp(b, "kvpool-", 7) != 0 || n < 7 + 1 + 1 + 1 + 1 + 16 || b[n - 17] != '-')
		return false;
	for (size_t i = n - 16; i < n; i++)
		if (!((b[i] >= '0' && b[i] <= '9') || (b[i] >= 'a' && b[i] <= 'f')))
			return false;
	size_t d = n - 17; /* digits of the pid before it, then a dash */
	size_t k = d;
	while (k > 7 && b[k - 1] >= '0' && b[k - 1] <= '9')
		k--;
	return k < d && k > 8 && b[k - 1] == '-';
}

/*
 * Why the open file fd at path is not a region this client may write, or
 * NULL: a plain file of one link with the name kvpoold gives regions, and
 * over ipc:// owned by the daemon's user as the kernel names it. A daemon
 * (or something in its place) naming any other file maps nothing.
 */
static const char *
not_a_region(struct kvp_client *c, const char *path, const struct stat *st)
{
	if (!S_ISREG(st->st_mode))
		return "not a plain file";
	if (st->st_nlink != 1)
		return "a file with other names (hard links)";
	if (!region_name(path))
		return "not a name kvpoold gives a region (kvpool-<pool>-<pid>-<16 hex digits>, or "
		       "kvpool-<pool>.region)";
	nng_mtx_lock(c->mtx);
	bool known = c->peer_uid_known;
	uint64_t uid = c->peer_uid;
	nng_mtx_unlock(c->mtx);
	if (known && (uint64_t)st->st_uid != uid)
		return "owned by another user than the daemon's";
	return NULL;
}

int
kvp_region_open(struct kvp_client *c, struct kvp_region **out)
{
	Kvpool__V1__RegionRequest m = KVPOOL__V1__REGION_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	struct kvp_region *g;
	struct stat st;
	int fd;

	if (c == NULL || out == NULL)
		return KVP_EINVAL;
	if (no_region(c))
		return KVP_ENOTSUP;
	KVP_CLIENT_CALL(c, region, REGION, &m, r);
	if (rv != KVP_OK)
		return rv;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_REGION || (g = calloc(1, sizeof(*g))) == NULL) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_ENOMEM, "%s", "out of memory, or no region in the reply");
	}
	const Kvpool__V1__RegionReply *x = r->region;
	snprintf(g->info.path, sizeof(g->info.path), "%s", x->path);
	g->info.bytes = x->bytes;
	g->info.row_bytes = x->row_bytes;
	g->info.row_stride = x->row_stride;
	g->info.num_rows = x->num_rows;
	g->info.shards = x->shards;
	g->info.shard_bytes = x->shard_bytes;
	kvpool__v1__reply__free_unpacked(r, NULL);
	/* O_NOFOLLOW: the daemon made a plain file; a link put there by someone else is not it. */
	fd = open(g->info.path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0 || fstat(fd, &st) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		char why[4200];
		snprintf(why, sizeof(why), "cannot open the region %s (%s): is the daemon on this "
		         "host, and may this user read it (--ipc-mode)?", g->info.path, strerror(e));
		free(g);
		return kvp_client_fail_(c, KVP_ENOTFOUND, "%s", why);
	}
	const char *bad = not_a_region(c, g->info.path, &st);
	if (bad != NULL) {
		char why[4400];
		snprintf(why, sizeof(why), "the daemon names %s as the region, which is %s: not mapped",
		         g->info.path, bad);
		close(fd);
		free(g);
		return kvp_client_fail_(c, KVP_ENOTOWNER, "%s", why);
	}
	if (!sane(&g->info, (uint64_t)st.st_size)) {
		close(fd);
		free(g);
		return kvp_client_fail_(c, KVP_EINTERNAL, "%s", "the region's reply does not match its file");
	}
	g->base = mmap(NULL, (size_t)g->info.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (g->base == MAP_FAILED) {
		close(fd);
		free(g);
		return kvp_client_fail_(c, KVP_ENOMEM, "cannot map the region: %s", strerror(errno));
	}
	g->fd = fd;
	*out = g;
	return KVP_OK;
}

void
kvp_region_close(struct kvp_region *r)
{
	if (r == NULL)
		return;
	munmap(r->base, (size_t)r->info.bytes);
	close(r->fd);
	free(r);
}

int
kvp_region_fd(const struct kvp_region *r)
{
	return r ? r->fd : -1;
}

const struct kvp_region_info *
kvp_region_info(const struct kvp_region *r)
{
	return r ? &r->info : NULL;
}

void *
kvp_region_row(const struct kvp_region *r, int32_t row)
{
	if (r == NULL || row <= 0 || (uint32_t)row >= r->info.num_rows)
		return NULL;
	return r->base + (uint64_t)row * r->info.row_stride;
}

bool
kvp_region_check(const struct kvp_region *r, int32_t row, uint32_t crc)
{
	const void *p = kvp_region_row(r, row);
	return p != NULL && kvp_crc32c(0, p, (size_t)r->info.row_bytes) == crc;
}

int
kvp_region_crc(const struct kvp_region *r, int32_t row, uint32_t *crc)
{
	const void *p = kvp_region_row(r, row);
	if (p == NULL || crc == NULL)
		return KVP_EINVAL;
	*crc = kvp_crc32c(0, p, (size_t)r->info.row_bytes);
	return KVP_OK;
}

/* A key list's checks: KVP_OK and the bytes field, or KVP_EINVAL. */
static int
key_list(struct kvp_client *c, const uint8_t *keys, size_t n, ProtobufCBinaryData *out)
{
	size_t kl = kvp_client_key_len(c);
	if (c == NULL || (keys == NULL && n > 0) || n > SIZE_MAX / kl)
		return KVP_EINVAL;
	if (no_region(c))
		return KVP_ENOTSUP;
	out->data = (uint8_t *)keys;
	out->len = n * kl;
	return KVP_OK;
}

int
kvp_client_reserve(struct kvp_client *c, const uint8_t *keys, size_t n, int32_t *rows,
                   uint8_t *evicted, size_t *num_evicted)
{
	Kvpool__V1__ReserveRequest m = KVPOOL__V1__RESERVE_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	int e;

	if ((rows == NULL && n > 0) || (e = key_list(c, keys, n, &m.keys)) != KVP_OK)
		return rows == NULL && n > 0 ? KVP_EINVAL : e;
	KVP_CLIENT_CALL(c, reserve, RESERVE, &m, r);
	if (rv != KVP_OK)
		return rv;
	size_t kl = kvp_client_key_len(c);
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_RESERVE || r->reserve->n_rows != n ||
	    r->reserve->evicted_keys.len % kl != 0 || r->reserve->evicted_keys.len / kl > n) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "%s", "malformed Reserve reply");
	}
	memcpy(rows, r->reserve->rows, n * sizeof(*rows));
	if (evicted != NULL && r->reserve->evicted_keys.len > 0) /* none: data may be NULL */
		memcpy(evicted, r->reserve->evicted_keys.data, r->reserve->evicted_keys.len);
	if (num_evicted != NULL)
		*num_evicted = r->reserve->evicted_keys.len / kl;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_commit(struct kvp_client *c, const uint8_t *keys, size_t n, const uint32_t *crcs,
                  bool checksum)
{
	Kvpool__V1__CommitRequest m = KVPOOL__V1__COMMIT_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	int e;

	if ((e = key_list(c, keys, n, &m.keys)) != KVP_OK)
		return e;
	if (crcs != NULL) {
		m.crc32c = (uint32_t *)crcs;
		m.n_crc32c = n;
	}
	m.no_checksum = crcs == NULL && !checksum;
	KVP_CLIENT_CALL(c, commit, COMMIT, &m, r);
	if (rv != KVP_OK)
		return rv;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

/* Abort and Unlock: a key list and nothing back. */
static int
keys_call(struct kvp_client *c, int which, const uint8_t *keys, size_t n)
{
	Kvpool__V1__AbortRequest a = KVPOOL__V1__ABORT_REQUEST__INIT;
	Kvpool__V1__UnlockRequest u = KVPOOL__V1__UNLOCK_REQUEST__INIT;
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	int rv;

	if ((rv = key_list(c, keys, n, &a.keys)) != KVP_OK)
		return rv;
	u.keys = a.keys;
	rq.call_case = (Kvpool__V1__Request__CallCase)which;
	if (which == KVPOOL__V1__REQUEST__CALL_ABORT)
		rq.abort = &a;
	else
		rq.unlock = &u;
	if ((rv = kvp_client_call_(c, &rq, &r)) != KVP_OK)
		return rv;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_abort(struct kvp_client *c, const uint8_t *keys, size_t n)
{
	return keys_call(c, KVPOOL__V1__REQUEST__CALL_ABORT, keys, n);
}

/* LookupAndLock; uncounted, each row's hits into counts (n entries). */
static int
lookup_lock(struct kvp_client *c, const uint8_t *keys, size_t n, bool prefix, int32_t *rows,
            uint32_t *crcs, size_t *num_looked, uint32_t *num_hits, bool uncounted,
            uint32_t *counts)
{
	Kvpool__V1__LookupAndLockRequest m = KVPOOL__V1__LOOKUP_AND_LOCK_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	int e;

	if (((rows == NULL || (uncounted && counts == NULL)) && n > 0) ||
	    (e = key_list(c, keys, n, &m.keys)) != KVP_OK)
		return n > 0 && (rows == NULL || (uncounted && counts == NULL)) ? KVP_EINVAL : e;
	m.prefix = prefix;
	m.uncounted = uncounted;
	KVP_CLIENT_CALL(c, lookup_and_lock, LOOKUP_AND_LOCK, &m, r);
	if (rv != KVP_OK)
		return rv;
	const Kvpool__V1__LookupAndLockReply *x = r->lookup_and_lock;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_LOOKUP_AND_LOCK || x->n_rows > n ||
	    x->n_crc32c != x->n_rows || (!prefix && x->n_rows != n) ||
	    (uncounted && x->n_hits != x->n_rows)) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "%s", "malformed LookupAndLock reply");
	}
	for (size_t i = 0; i < n; i++) {
		rows[i] = i < x->n_rows ? x->rows[i] : -1;
		if (crcs != NULL)
			crcs[i] = i < x->n_rows ? x->crc32c[i] : 0;
		if (uncounted)
			counts[i] = i < x->n_rows ? x->hits[i] : 0;
	}
	if (num_looked != NULL)
		*num_looked = x->n_rows;
	if (num_hits != NULL)
		*num_hits = x->num_hits;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_lookup_lock(struct kvp_client *c, const uint8_t *keys, size_t n, bool prefix,
                       int32_t *rows, uint32_t *crcs, size_t *num_looked, uint32_t *num_hits)
{
	return lookup_lock(c, keys, n, prefix, rows, crcs, num_looked, num_hits, false, NULL);
}

int
kvp_client_lookup_lock_uncounted(struct kvp_client *c, const uint8_t *keys, size_t n,
                                 int32_t *rows, uint32_t *crcs, uint32_t *hits)
{
	return lookup_lock(c, keys, n, false, rows, crcs, NULL, NULL, true, hits);
}

int
kvp_client_unlock(struct kvp_client *c, const uint8_t *keys, size_t n)
{
	return keys_call(c, KVPOOL__V1__REQUEST__CALL_UNLOCK, keys, n);
}

int
kvp_client_cluster_fill(struct kvp_client *c, const uint8_t *absent, size_t n_absent,
                        uint8_t *wanted, size_t max_wants, size_t *n_wanted, uint32_t *waiting)
{
	Kvpool__V1__ClusterFillRequest m = KVPOOL__V1__CLUSTER_FILL_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	size_t kl;
	int e;

	if (n_wanted == NULL || (wanted == NULL && max_wants > 0) || max_wants > UINT32_MAX)
		return KVP_EINVAL;
	if ((e = key_list(c, absent, n_absent, &m.absent_keys)) != KVP_OK)
		return e;
	kl = kvp_client_key_len(c);
	m.max_wants = (uint32_t)max_wants;
	KVP_CLIENT_CALL(c, cluster_fill, CLUSTER_FILL, &m, r);
	if (rv != KVP_OK)
		return rv;
	const Kvpool__V1__ClusterFillReply *x = r->cluster_fill;
	if (r->result_case != KVPOOL__V1__REPLY__RESULT_CLUSTER_FILL || x->wanted_keys.len % kl ||
	    x->wanted_keys.len / kl > max_wants) {
		kvpool__v1__reply__free_unpacked(r, NULL);
		return kvp_client_fail_(c, KVP_EINTERNAL, "%s", "malformed ClusterFill reply");
	}
	*n_wanted = x->wanted_keys.len / kl;
	if (x->wanted_keys.len > 0)
		memcpy(wanted, x->wanted_keys.data, x->wanted_keys.len);
	if (waiting != NULL)
		*waiting = x->waiting;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

int
kvp_client_cluster_announce(struct kvp_client *c, const uint8_t *stored, size_t n_stored,
                            const uint8_t *removed, size_t n_removed)
{
	Kvpool__V1__ClusterFillRequest m = KVPOOL__V1__CLUSTER_FILL_REQUEST__INIT;
	Kvpool__V1__Reply *r = NULL;
	int e;

	if ((e = key_list(c, stored, n_stored, &m.stored_keys)) != KVP_OK ||
	    (e = key_list(c, removed, n_removed, &m.removed_keys)) != KVP_OK)
		return e;
	if (n_stored == 0 && n_removed == 0)
		return KVP_OK;
	KVP_CLIENT_CALL(c, cluster_fill, CLUSTER_FILL, &m, r);
	if (rv != KVP_OK)
		return rv;
	kvpool__v1__reply__free_unpacked(r, NULL);
	return KVP_OK;
}

struct copy_part {
	void *const *dst;
	const void *const *src;
	const uint64_t *len;
	size_t from, to;
};

static void *
copy_part(void *arg)
{
	struct copy_part *p = arg;
	for (size_t i = p->from; i < p->to; i++)
		memcpy(p->dst[i], p->src[i], (size_t)p->len[i]);
	return NULL;
}

#define KVP_COPY_MAX_THREADS 16

int
kvp_copy_many(void *const *dst, const void *const *src, const uint64_t *len, size_t n,
              unsigned threads)
{
	struct copy_part parts[KVP_COPY_MAX_THREADS];
	pthread_t tid[KVP_COPY_MAX_THREADS];
	uint64_t total = 0, acc = 0;
	size_t np = 0, i = 0;

	if (n > 0 && (dst == NULL || src == NULL || len == NULL))
		return KVP_EINVAL;
	for (size_t k = 0; k < n; k++)
		total += len[k];
	if (threads > KVP_COPY_MAX_THREADS)
		threads = KVP_COPY_MAX_THREADS;
	/* Below a few MiB a thread costs more than it copies. */
	if (threads <= 1 || total < (4u << 20) || n < 2) {
		struct copy_part one = {dst, src, len, 0, n};
		copy_part(&one);
		return KVP_OK;
	}
	/* Equal bytes per part, whole pieces each. */
	for (unsigned t = 0; t < threads && i < n; t++) {
		size_t from = i;
		uint64_t goal = total * (t + 1) / threads;
		while (i < n && (acc < goal || i == from))
			acc += len[i++];
		parts[np++] = (struct copy_part){dst, src, len, from, i};
	}
	bool running[KVP_COPY_MAX_THREADS] = {false};
	for (size_t t = 1; t < np; t++)
		running[t] = pthread_create(&tid[t], NULL, copy_part, &parts[t]) == 0;
	copy_part(&parts[0]);
	for (size_t t = 1; t < np; t++) {
		if (running[t])
			pthread_join(tid[t], NULL);
		else
			copy_part(&parts[t]); /* no thread to be had: this one copies it */
	}
	return KVP_OK;
}
