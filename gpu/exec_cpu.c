/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cpu backend: KV memory in host memory (anonymous mappings, huge pages
 * where offered, pages committed on first touch; or a shared region, a file
 * every byte of which is allocated at open), moved with memcpy. It is the
 * reference the CUDA backend is compared with, so it stays plain: every
 * loop below is the kernel's loop with the thread indices spelled out.
 */
#define _GNU_SOURCE /* MAP_POPULATE, madvise */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/big_alloc.h"
#include "gpu/exec_impl.h"
#include "common/kvp_status.h"

static unsigned char *
mem(struct kvp_exec *e)
{
	return e->impl;
}

/*
 * The region: a file made with O_EXCL under a name no other process can
 * predict, its blocks allocated now (posix_fallocate: a tmpfs too small for
 * the pool fails here, with a reason, instead of a SIGBUS at first write),
 * then mapped shared. The daemon writes through this mapping, clients
 * through theirs: the same pages.
 */
/* hugetlbfs sizes files in whole huge pages: the region rounded up to one. */
static void
round_to_huge_page(struct kvp_exec *e, int fd)
{
	struct statfs sf;
	if (fstatfs(fd, &sf) == 0 && sf.f_type == 0x958458f6 /* HUGETLBFS_MAGIC */ &&
	    sf.f_bsize > 0) {
		uint64_t hp = (uint64_t)sf.f_bsize;
		e->mem_bytes = (e->mem_bytes + hp - 1) / hp * hp;
	}
}

/*
 * A region kept across lives (restart=warm): "kvpool-<name>.region", locked
 * for as long as it is open. A file of the region's size is mapped as it is
 * (its rows an earlier life's, which the caller checks before trusting);
 * any other is emptied and allocated anew.
 */
static int
region_open_kept(struct kvp_exec *e)
{
	const struct kvp_exec_config *c = e->cfg;
	struct stat st;
	int fd, err;

	if ((size_t)snprintf(e->region_path, sizeof(e->region_path), "%s/kvpool-%s.region",
	                     c->region_dir, c->region_name ? c->region_name : "pool") >=
	    sizeof(e->region_path)) {
		snprintf(e->err, sizeof(e->err), "region path in %.160s too long", c->region_dir);
		e->region_path[0] = '\0';
		return KVP_EINVAL;
	}
	fd = open(e->region_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
	          (mode_t)(c->region_mode & 0777));
	if (fd < 0) {
		snprintf(e->err, sizeof(e->err), "cannot open region %.160s: %s", e->region_path,
		         strerror(errno));
		e->region_path[0] = '\0';
		return KVP_EINVAL;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		snprintf(e->err, sizeof(e->err), "region %.160s is held by another process (a "
		         "kvpoold on the same configuration still running?): %s", e->region_path,
		         strerror(errno));
		close(fd);
		e->region_path[0] = '\0';
		return KVP_EINVAL;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		snprintf(e->err, sizeof(e->err), "region %.160s: not a regular file of this user",
		         e->region_path);
		close(fd);
		e->region_path[0] = '\0';
		return KVP_EINVAL;
	}
	(void)fchmod(fd, (mode_t)(c->region_mode & 0777));
	round_to_huge_page(e, fd);
	e->region_kept = (uint64_t)st.st_size == e->mem_bytes;
	if (!e->region_kept && ((err = ftruncate(fd, 0) != 0 ? errno : 0) != 0 ||
	                        (err = posix_fallocate(fd, 0, (off_t)e->mem_bytes)) != 0))
		goto fail;
	e->impl = mmap(NULL, (size_t)e->mem_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (e->impl == MAP_FAILED) {
		e->impl = NULL;
		err = errno;
		goto fail;
	}
	e->region_fd = fd;
	return KVP_OK;
fail:
	snprintf(e->err, sizeof(e->err), "cannot allocate %llu bytes for region %.160s: %s",
	         (unsigned long long)e->mem_bytes, e->region_path, strerror(err));
	close(fd);
	e->region_path[0] = '\0';
	e->region_kept = false;
	return KVP_ENOMEM;
}

static int
region_open(struct kvp_exec *e)
{
	const struct kvp_exec_config *c = e->cfg;
	uint64_t r;
	int fd, err;

	if (c->region_keep)
		return region_open_kept(e);
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
		r = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)e;
	if ((size_t)snprintf(e->region_path, sizeof(e->region_path), "%s/kvpool-%s-%ld-%016llx",
	                     c->region_dir, c->region_name ? c->region_name : "pool",
	                     (long)getpid(), (unsigned long long)r) >= sizeof(e->region_path)) {
		snprintf(e->err, sizeof(e->err), "region path in %.160s too long", c->region_dir);
		e->region_path[0] = '\0';
		return KVP_EINVAL;
	}
	fd = open(e->region_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
	          (mode_t)(c->region_mode & 0777));
	if (fd < 0) {
		snprintf(e->err, sizeof(e->err), "cannot create region %.160s: %s", e->region_path,
		         strerror(errno));
		e->region_path[0] = '\0';
		return errno == ENOMEM ? KVP_ENOMEM : KVP_EINVAL;
	}
	/* open() applies the umask; the mode asked for is the mode meant. */
	if (fchmod(fd, (mode_t)(c->region_mode & 0777)) != 0) {
		err = errno;
		goto fail;
	}
	round_to_huge_page(e, fd);
	if ((err = posix_fallocate(fd, 0, (off_t)e->mem_bytes)) != 0)
		goto fail;
	e->impl = mmap(NULL, (size_t)e->mem_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (e->impl == MAP_FAILED) {
		e->impl = NULL;
		err = errno;
		goto fail;
	}
	close(fd);
#ifdef MADV_HUGEPAGE
	/* tmpfs gives huge pages where shmem_enabled says advise: a hint, fine if refused. */
	(void)madvise(e->impl, (size_t)e->mem_bytes, MADV_HUGEPAGE);
#endif
	return KVP_OK;
fail:
	snprintf(e->err, sizeof(e->err), "cannot allocate %llu bytes for region %.160s: %s",
	         (unsigned long long)e->mem_bytes, e->region_path, strerror(err));
	close(fd);
	unlink(e->region_path);
	e->region_path[0] = '\0';
	return KVP_ENOMEM;
}

int
kvp_exec_region_sweep(const char *dir, unsigned *removed)
{
	DIR *d;
	struct dirent *de;
	unsigned n = 0;

	if (dir == NULL || (d = opendir(dir)) == NULL)
		return KVP_EINVAL;
	while ((de = readdir(d)) != NULL) {
		/* kvpool-<name>-<pid>-<16 hex digits>: the pid is the field before the last */
		const char *last = strrchr(de->d_name, '-');
		char path[4096];
		struct stat st;
		if (strncmp(de->d_name, "kvpool-", 7) != 0 || last == NULL || strlen(last) != 17)
			continue;
		const char *p = last;
		while (p > de->d_name && p[-1] >= '0' && p[-1] <= '9')
			p--;
		if (p == last || p[-1] != '-')
			continue;
		long pid = strtol(p, NULL, 10);
		if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= sizeof(path) ||
		    lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
			continue;
		n += unlink(path) == 0;
	}
	closedir(d);
	if (removed != NULL)
		*removed = n;
	return KVP_OK;
}

static int
cpu_open(struct kvp_exec *e, int device)
{
	(void)device;
	if (e->mem_bytes > SIZE_MAX) {
		snprintf(e->err, sizeof(e->err), "%llu bytes of KV memory do not fit in memory",
		         (unsigned long long)e->mem_bytes);
		return KVP_ENOMEM;
	}
	if (e->cfg != NULL && e->cfg->region_dir != NULL)
		return region_open(e);
	if ((e->impl = kvp_big_alloc((size_t)e->mem_bytes)) == NULL) {
		snprintf(e->err, sizeof(e->err), "cannot map %llu bytes of KV memory",
		         (unsigned long long)e->mem_bytes);
		return KVP_ENOMEM;
	}
	return KVP_OK;
}

static void
cpu_close(struct kvp_exec *e)
{
	if (e->region_path[0] != '\0') {
		munmap(e->impl, (size_t)e->mem_bytes);
		if (e->region_fd >= 0)
			close(e->region_fd); /* kept: the file stays for the next life */
		else
			unlink(e->region_path);
		return;
	}
	kvp_big_free(e->impl, (size_t)e->mem_bytes);
}

/* Byte address of chunk (layer, kv, block) in the cache, and of a payload's chunk. */
static unsigned char *
chunk(struct kvp_exec *e, uint32_t layer, uint32_t kv, int32_t block)
{
	return mem(e) + kvp_chunk_offset(&e->st, layer, kv, (uint64_t)block) * e->st.elem_bytes;
}

static size_t
payload_chunk(struct kvp_exec *e, size_t i, uint32_t layer, uint32_t kv)
{
	return kvp_payload_offset(&e->st, e->shape.num_layers, i, layer, kv) * e->st.elem_bytes;
}

/*
 * Chunks sit at scattered addresses, so the hardware prefetcher restarts at
 * each one; touching the start of the next source chunk while this one is
 * copied hides most of that restart (measured: gather from 0.7 to about 0.9
 * of a flat memcpy of the same bytes).
 */
static void
prefetch(const unsigned char *p)
{
	__builtin_prefetch(p);
	__builtin_prefetch(p + 64);
}

static int
cpu_read_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, void *dst)
{
	unsigned char *out = dst;
	uint32_t nl = e->shape.num_layers;
	if (e->shape.rows) { /* a row is the payload: one copy per block */
		for (size_t i = 0; i < n; i++)
			memcpy(out + i * e->block_bytes, chunk(e, 0, 0, ids[i]), e->block_bytes);
		return KVP_OK;
	}
	for (size_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < nl; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				/* the next chunk: same block's next (layer, kv), or the next block's first */
				if (kv == 0)
					prefetch(chunk(e, l, 1, ids[i]));
				else if (l + 1 < nl)
					prefetch(chunk(e, l + 1, 0, ids[i]));
				else if (i + 1 < n)
					prefetch(chunk(e, 0, 0, ids[i + 1]));
				memcpy(out + payload_chunk(e, i, l, kv), chunk(e, l, kv, ids[i]),
				       e->chunk_bytes);
			}
	return KVP_OK;
}

static int
cpu_write_blocks(struct kvp_exec *e, const int32_t *ids, size_t n, const void *src)
{
	const unsigned char *in = src;
	if (e->shape.rows) {
		for (size_t i = 0; i < n; i++)
			memcpy(chunk(e, 0, 0, ids[i]), in + i * e->block_bytes, e->block_bytes);
		return KVP_OK;
	}
	for (size_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < e->shape.num_layers; l++)
			for (uint32_t kv = 0; kv < 2; kv++)
				memcpy(chunk(e, l, kv, ids[i]), in + payload_chunk(e, i, l, kv),
				       e->chunk_bytes);
	return KVP_OK;
}

static int
cpu_copy_blocks(struct kvp_exec *e, const int32_t *src, const int32_t *dst, size_t n)
{
	uint32_t nl = e->shape.num_layers;
	for (size_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < nl; l++)
			for (uint32_t kv = 0; kv < 2; kv++) {
				if (kv == 0)
					prefetch(chunk(e, l, 1, src[i]));
				else if (l + 1 < nl)
					prefetch(chunk(e, l + 1, 0, src[i]));
				else if (i + 1 < n)
					prefetch(chunk(e, 0, 0, src[i + 1]));
				memcpy(chunk(e, l, kv, dst[i]), chunk(e, l, kv, src[i]), e->chunk_bytes);
			}
	return KVP_OK;
}

static int
cpu_write_tokens(struct kvp_exec *e, uint32_t layer0, uint32_t nlayers, const int64_t *slots,
                 size_t n, const void *k, const void *v)
{
	const struct kvp_kv_strides *st = &e->st;
	const unsigned char *src[2] = {k, v};
	size_t row = e->shape.head_size * st->elem_bytes;

	for (uint32_t li = 0; li < nlayers; li++)
		for (size_t t = 0; t < n; t++) {
			if (slots[t] < 0)
				continue;
			uint64_t b = kvp_slot_block(slots[t], e->shape.block_size);
			uint32_t o = kvp_slot_offset(slots[t], e->shape.block_size);
			for (uint32_t kv = 0; kv < 2; kv++) {
				const unsigned char *in =
					src[kv] + ((uint64_t)li * n + t) * st->token_elems * st->elem_bytes;
				for (uint32_t h = 0; h < e->shape.num_heads; h++)
					memcpy(mem(e) + kvp_elem_offset(st, layer0 + li, kv, b, o, h, 0) *
					                    st->elem_bytes,
					       in + h * row, row);
			}
		}
	return KVP_OK;
}

const struct kvp_exec_ops kvp_exec_cpu_ops = {
	.name = "cpu",
	.medium = "CPU",
	.open = cpu_open,
	.close = cpu_close,
	.read_blocks = cpu_read_blocks,
	.write_blocks = cpu_write_blocks,
	.copy_blocks = cpu_copy_blocks,
	.write_tokens = cpu_write_tokens,
	.bench = NULL,
};
