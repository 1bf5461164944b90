/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvp-bench-executor: the executor's speed, each number next to its
 * baseline measured in the same run.
 *
 *   local  read_blocks / write_blocks / copy_blocks / write_tokens on the
 *          cpu backend, in GB/s, against memcpy of the same bytes;
 *   remote ReadBlocks and WriteBlocks through kvpoold over ipc:// and
 *          tcp://, against a raw nng REQ/REP round trip of the same bytes;
 *   --gpu  the cuda backend on a 32-layer bf16 shape: its kernels against a
 *          device-to-device cudaMemcpy of the same bytes, read_blocks and
 *          write_blocks against pinned cudaMemcpy, then the remote rows with
 *          a cuda pool (needs a GPU).
 *
 * usage: kvp-bench-executor [--quick] [--gpu] [path/to/kvpoold]
 */
#define _POSIX_C_SOURCE 200809L

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../spawn.h"
#include "bench_util.h"
#include "gpu/executor.h"
#include "clients/c/kvpool.h"

/* vLLM-like: 16 tokens, 8 KV heads of 128, fp16, 4 layers: 32 KiB chunks, 256 KiB blocks. */
#define LAYERS 4
#define HEADS 8
#define HEAD 128
#define BS 16
#define N_SIZES(a) (sizeof(a) / sizeof((a)[0]))

static double seconds = 1.0;
static uint64_t rng = 88172645463325252ull;

static uint64_t
next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* n distinct random ids in 1..nb-1. */
static void
pick(int32_t *ids, uint32_t n, uint32_t nb)
{
	for (uint32_t i = 0; i < n; i++) {
		bool dup;
		do {
			ids[i] = (int32_t)(1 + next() % (nb - 1));
			dup = false;
			for (uint32_t j = 0; j < i; j++)
				dup |= ids[j] == ids[i];
		} while (dup);
	}
}

enum op { OP_MEMCPY, OP_READ, OP_WRITE, OP_COPY, OP_TOKENS };

struct local {
	struct kvp_exec *e;
	uint32_t nb, n;
	size_t bb, bytes;
	unsigned char *buf, *src_region; /* buf: n blocks; src_region: nb blocks (memcpy's source) */
	unsigned char *k, *v;
	int64_t *slots;
};

/* One call of op on fresh random blocks. */
static void
one(struct local *L, enum op op)
{
	int32_t ids[1024], dst[1024];
	int rv = KVP_OK;
	pick(ids, op == OP_COPY ? 2 * L->n : L->n, L->nb);
	switch (op) {
	case OP_MEMCPY: {
		/* The same bytes from a random place in a region as large as the cache. */
		size_t off = (size_t)(next() % (L->nb - L->n)) * L->bb;
		memcpy(L->buf, L->src_region + off, L->bytes);
		break;
	}
	case OP_READ:
		rv = kvp_exec_read_blocks(L->e, ids, L->n, L->buf, L->bytes);
		break;
	case OP_WRITE:
		rv = kvp_exec_write_blocks(L->e, ids, L->n, L->buf, L->bytes);
		break;
	case OP_COPY:
		memcpy(dst, ids + L->n, L->n * sizeof(*dst));
		rv = kvp_exec_copy_blocks(L->e, ids, dst, L->n);
		break;
	case OP_TOKENS:
		for (uint32_t b = 0; b < L->n; b++)
			for (uint32_t o = 0; o < BS; o++)
				L->slots[b * BS + o] = (int64_t)ids[b] * BS + o;
		rv = kvp_exec_write_tokens(L->e, true, 0, L->slots, (size_t)L->n * BS, L->k, L->v,
		                           L->bytes / 2);
		break;
	}
	if (rv != KVP_OK) {
		fprintf(stderr, "bench: local op %d: %s\n", (int)op, kvp_strerror(rv));
		exit(1);
	}
}

/*
 * op against memcpy, alternating in short slices (this machine's memory
 * bandwidth drifts with its neighbours): returns op's and memcpy's bytes per
 * second, each the median over the slices.
 */
#define SLICES 15
static void
run_local(struct local *L, enum op op, double *op_bps, double *base_bps)
{
	double t_op[SLICES], t_base[SLICES];
	int per = 4;
	for (int s = 0; s < SLICES; s++) {
		for (int k = 0; k < 2; k++) {
			enum op which = k ? op : OP_MEMCPY;
			double t0 = now();
			for (int i = 0; i < per; i++)
				one(L, which);
			(k ? t_op : t_base)[s] = (now() - t0) / per;
		}
	}
	*op_bps = (double)L->bytes / median(t_op, SLICES);
	*base_bps = (double)L->bytes / median(t_base, SLICES);
}

static int
bench_local(bool quick)
{
	struct local L = {.nb = quick ? 256 : 1024, .n = 64};
	struct kvp_exec_config cfg = {.backend = KVP_EXEC_CPU,
	                              .shape = {L.nb, BS, LAYERS, HEADS, HEAD, KVP_DTYPE_FP16,
	                                        KVP_LAYOUT_NHD}};
	char why[256];
	if (kvp_exec_open(&cfg, &L.e, why, sizeof(why)) != KVP_OK) {
		fprintf(stderr, "bench: %s\n", why);
		return 1;
	}
	L.bb = kvp_exec_block_bytes(L.e);
	L.bytes = L.n * L.bb;
	L.buf = malloc(L.bytes);
	L.src_region = malloc(L.nb * L.bb);
	L.k = malloc(L.bytes / 2);
	L.v = malloc(L.bytes / 2);
	L.slots = malloc((size_t)L.n * BS * sizeof(*L.slots));
	memset(L.buf, 1, L.bytes);
	memset(L.src_region, 2, L.nb * L.bb);
	memset(L.k, 3, L.bytes / 2);
	memset(L.v, 4, L.bytes / 2);
	/* Touch all of the cache once so no row pays for first-touch page faults. */
	for (uint32_t b = 0; b < L.nb; b += L.n) {
		int32_t ids[64];
		uint32_t k = L.nb - b < L.n ? L.nb - b : L.n;
		for (uint32_t i = 0; i < k; i++)
			ids[i] = (int32_t)(b + i);
		kvp_exec_write_blocks(L.e, ids, k, L.buf, k * L.bb);
	}
	printf("## local: cpu backend, %u blocks of %zu KiB (%d layers x K,V x [%d, %d, %d] fp16), "
	       "%u random blocks (%zu MiB) per call\n\n",
	       L.nb, L.bb >> 10, LAYERS, BS, HEADS, HEAD, L.n, L.bytes >> 20);
	printf("| operation | GB/s | memcpy GB/s (alternating slices) | ratio |\n|---|---|---|---|\n");
	const char *names[] = {"memcpy (baseline)", "read_blocks (gather)", "write_blocks (scatter)",
	                       "copy_blocks", "write_tokens (all layers, 256 B rows)"};
	for (int op = OP_READ; op <= OP_TOKENS; op++) {
		double base, r;
		run_local(&L, (enum op)op, &r, &base);
		printf("| %s | %.2f | %.2f | %.2f |\n", names[op], r / 1e9, base / 1e9, r / base);
		char row[160];
		snprintf(row, sizeof(row), "cpu backend, in process: %s, %u blocks of %zu KiB a call",
		         names[op], L.n, L.bb >> 10);
		bench_json("executor", row, r, "B/s", "memcpy of the same bytes", base, "higher");
	}
	printf("\n");
	kvp_exec_close(L.e);
	free(L.buf);
	free(L.src_region);
	free(L.k);
	free(L.v);
	free(L.slots);
	return 0;
}

/* ---- remote ---- */

static char ipc_url[128], tcp_url[128], raw_ipc[128], raw_tcp[128];
static size_t raw_size;
static int raw_fill;               /* copy the reply's bytes from memory, as a server must */
static unsigned char *raw_source;  /* 16 MiB to copy from */

/*
 * The raw server: every request is answered by a fresh message of raw_size
 * bytes, left as allocated, or (raw_fill) filled by memcpy from memory.
 */
static void *
raw_server(void *arg)
{
	nng_socket s = *(nng_socket *)arg;
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(s, &m, 0) != 0)
			return NULL;
		nng_msg_free(m);
		if (nng_msg_alloc(&m, raw_size) != 0)
			return NULL;
		if (raw_fill)
			memcpy(nng_msg_body(m), raw_source, raw_size);
		if (nng_sendmsg(s, m, 0) != 0) {
			nng_msg_free(m);
			return NULL;
		}
	}
}

/*
 * Bytes per second fetching `size`-byte replies from the raw server at url,
 * or (up) sending `size`-byte requests, filled from memory when fill, that
 * it answers with 16 bytes.
 */
static double
run_raw(const char *url, size_t size, int fill, bool up)
{
	nng_socket s;
	double t0, dt = 1e-9;
	long n = 0;
	raw_size = up ? 16 : size;
	raw_fill = up ? 0 : fill;
	if (nng_req0_open(&s) != 0 || nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 0) != 0 ||
	    nng_dial(s, url, NULL, 0) != 0)
		return 0;
	t0 = now();
	do {
		nng_msg *m;
		if (nng_msg_alloc(&m, up ? size : 16) != 0)
			break;
		if (up && fill)
			memcpy(nng_msg_body(m), raw_source, size);
		if (nng_sendmsg(s, m, 0) != 0 || nng_recvmsg(s, &m, 0) != 0)
			break;
		nng_msg_free(m);
		n++;
		dt = now() - t0;
	} while (dt < seconds);
	nng_close(s);
	return (double)size * (double)n / dt;
}

/*
 * Bytes per second reading nblocks per kvp_client_read_blocks through the
 * daemon, or (write) writing nblocks of its own per kvp_client_write_blocks.
 */
static double
run_remote(const char *url, uint32_t nblocks, int32_t *ids, size_t bb, bool write, int *failed)
{
	struct kvp_client_options o = {.url = url, .pool = "bench", .timeout_ms = 10000};
	struct kvp_client *c;
	unsigned char *buf = malloc(nblocks * bb);
	int32_t own[64];
	double t0, dt = 1e-9;
	long n = 0;
	/* A reader holds what it reads (the daemon serves only held blocks): a Touch, untimed. */
	if (kvp_client_open(&o, &c) != KVP_OK || nblocks > 64 ||
	    (write && kvp_client_allocate(c, nblocks, own) != KVP_OK) ||
	    (!write && kvp_client_touch(c, ids, nblocks) != KVP_OK)) {
		*failed = 1;
		free(buf);
		return 0;
	}
	memset(buf, 5, nblocks * bb);
	t0 = now();
	do {
		int rv = write ? kvp_client_write_blocks(c, own, nblocks, buf, nblocks * bb)
		               : kvp_client_read_blocks(c, ids, nblocks, buf, nblocks * bb, NULL);
		if (rv != KVP_OK) {
			fprintf(stderr, "bench: %s: %s\n", write ? "write" : "read",
			        kvp_client_last_detail(c));
			*failed = 1;
			break;
		}
		n++;
		dt = now() - t0;
	} while (dt < seconds);
	(void)kvp_client_free(c, write ? own : ids, nblocks);
	kvp_client_close(c);
	free(buf);
	return (double)nblocks * bb * (double)n / dt;
}

static int
bench_remote(const char *daemon, bool quick, const char *executor)
{
	int pid = (int)getpid(), failed = 0;
	nng_socket raw;
	pthread_t th;
	char blocks[64], layers[16], heads[16], head[16];

	snprintf(ipc_url, sizeof(ipc_url), "ipc:///tmp/kvpool-bench-x-%d.ipc", pid);
	snprintf(tcp_url, sizeof(tcp_url), "tcp://127.0.0.1:%d", bench_tcp_port(0));
	snprintf(raw_ipc, sizeof(raw_ipc), "ipc:///tmp/kvpool-bench-xraw-%d.ipc", pid);
	snprintf(raw_tcp, sizeof(raw_tcp), "tcp://127.0.0.1:%d", bench_tcp_port(1));
	snprintf(blocks, sizeof(blocks), "name=bench,blocks=%d,block_size=%d,executor=%s",
	         quick ? 256 : 1024, BS, executor);
	snprintf(layers, sizeof(layers), "%d", LAYERS);
	snprintf(heads, sizeof(heads), "%d", HEADS);
	snprintf(head, sizeof(head), "%d", HEAD);
	const char *dargv[] = {daemon, "--quiet", "--rpc", ipc_url, "--rpc", tcp_url, "--admin",
	                       "none", "--events", "none", "--pool", blocks, "--kv-layers", layers,
	                       "--kv-heads", heads, "--kv-head-size", head, "--lease-ms", "60000",
	                       NULL};
	pid_t child = kvp_spawn(dargv, NULL); /* before the first nng call */
	raw_source = malloc(16u << 20);
	memset(raw_source, 9, 16u << 20);
	if (nng_rep0_open(&raw) != 0 || nng_listen(raw, raw_ipc, NULL, 0) != 0 ||
	    nng_listen(raw, raw_tcp, NULL, 0) != 0 ||
	    pthread_create(&th, NULL, raw_server, &raw) != 0) {
		fprintf(stderr, "bench: cannot start the raw server\n");
		kill(child, SIGTERM);
		return 1;
	}
	nanosleep(&(struct timespec){0, 300000000}, NULL);

	/* Fill some blocks, cache them so any client may read them. */
	struct kvp_client_options o = {.url = ipc_url, .pool = "bench", .timeout_ms = 10000};
	struct kvp_client *c = NULL;
	int rv = KVP_EBUSY;
	for (int i = 0; i < 50 && rv != KVP_OK && waitpid(child, NULL, WNOHANG) == 0; i++)
		if ((rv = kvp_client_open(&o, &c)) != KVP_OK)
			nanosleep(&(struct timespec){0, 100000000}, NULL);
	if (rv != KVP_OK) {
		fprintf(stderr, "bench: cannot reach kvpoold\n");
		kill(child, SIGTERM);
		return 1;
	}
	enum { N = 64 };
	int32_t ids[N];
	size_t bb = kvp_client_info(c)->executor.block_bytes;
	uint32_t per_msg = (uint32_t)((kvp_client_info(c)->max_msg_bytes - 4096) / (bb + 16));
	unsigned char *buf = malloc(N * bb);
	int64_t *tokens = malloc((size_t)N * BS * sizeof(*tokens));
	uint32_t stored;
	memset(buf, 7, N * bb);
	for (int i = 0; i < N * BS; i++)
		tokens[i] = i;
	struct kvp_client_cache ca = {.block_ids = ids, .num_block_ids = N, .num_full_blocks = N,
	                              .tokens = tokens, .num_tokens = (size_t)N * BS};
	if (kvp_client_allocate(c, N, ids) != KVP_OK ||
	    kvp_client_write_blocks(c, ids, N, buf, N * bb) != KVP_OK ||
	    kvp_client_cache(c, &ca, &stored) != KVP_OK) {
		fprintf(stderr, "bench: setup: %s\n", kvp_client_last_detail(c));
		failed = 1;
	}

	printf("## remote: ReadBlocks and WriteBlocks through kvpoold (%s backend, blocks of %zu "
	       "KiB), checksums computed and verified, one client, against a raw nng REQ/REP round "
	       "trip carrying the same bytes in fresh messages, left as allocated (raw nng) or "
	       "filled by memcpy (raw nng + memcpy)\n\n",
	       executor, bb >> 10);
	printf("| call | transport | per call | kvpool GB/s | raw nng GB/s | ratio | raw nng + memcpy "
	       "GB/s | ratio |\n|---|---|---|---|---|---|---|---|\n");
	struct {
		uint32_t blocks;
		const char *label;
	} rows[] = {{4, "1 MiB (4 blocks)"}, {per_msg, "one full message"},
	            {N, "64 blocks (16 MiB), split below the 8 MiB limit"}};
	for (int wt = 0; wt < 4 && !failed; wt++) {
		int w = wt / 2, t = wt % 2; /* read then write; ipc then tcp */
		const char *url = t ? tcp_url : ipc_url, *rurl = t ? raw_tcp : raw_ipc;
		for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
			uint32_t nb = rows[r].blocks;
			/* The baseline's message: one call's payload, or one full message when split. */
			size_t msg = (nb <= per_msg ? nb : per_msg) * bb;
			double base = run_raw(rurl, msg, 0, w), filled = run_raw(rurl, msg, 1, w);
			double ours = run_remote(url, nb, ids, bb, w, &failed);
			char label[64];
			snprintf(label, sizeof(label), "%s", rows[r].label);
			if (r == 1)
				snprintf(label, sizeof(label), "%u blocks (%.1f MiB, one message)", nb,
				         (double)(nb * bb) / (1 << 20));
			printf("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
			       w ? "WriteBlocks" : "ReadBlocks", t ? "tcp" : "ipc", label,
			       ours / 1e9, base / 1e9, base > 0 ? ours / base : 0, filled / 1e9,
			       filled > 0 ? ours / filled : 0);
			char row[200];
			snprintf(row, sizeof(row), "%s through kvpoold (%s backend) over %s, %s",
			         w ? "WriteBlocks" : "ReadBlocks", executor, t ? "tcp" : "ipc", label);
			bench_json(strcmp(executor, "cuda") == 0 ? "gpu" : "executor", row, ours, "B/s",
			           "raw nng round trip of the same bytes, filled by memcpy", filled,
			           "higher");
		}
	}
	printf("\n");
	(void)kvp_client_free(c, ids, N);
	kvp_client_close(c);
	free(buf);
	free(tokens);
	int status = kvp_reap(child, 10000);
	nng_close(raw);
	pthread_join(th, NULL);
	free(raw_source);
	if (failed || status != 0) {
		fprintf(stderr, "bench: a call failed or the daemon did not stop cleanly\n");
		return 1;
	}
	return 0;
}

/* Median wall time of read_blocks or write_blocks of ids 0..n-1 to or from pageable buf. */
static double
host_call_s(struct kvp_exec *e, bool read, uint32_t n, unsigned char *buf, size_t bytes, int iters)
{
	int32_t *ids = malloc(n * sizeof(*ids));
	double t[21];
	int k = iters < 21 ? iters : 21;
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)i;
	for (int it = -1; it < k; it++) { /* -1: warm-up (staging grows) */
		double t0 = now();
		int rv = read ? kvp_exec_read_blocks(e, ids, n, buf, bytes)
		              : kvp_exec_write_blocks(e, ids, n, buf, bytes);
		if (rv != KVP_OK) {
			fprintf(stderr, "bench: %s: %s\n", read ? "read" : "write", kvp_exec_last_error(e));
			free(ids);
			return -1;
		}
		if (it >= 0)
			t[it] = now() - t0;
	}
	free(ids);
	return median(t, k);
}

/*
 * The cuda backend on realistic shapes (32 layers, 8 KV heads of 128, bf16;
 * blocks of 16 and 32 tokens): the kernels against cudaMemcpy device to
 * device, and read_blocks / write_blocks (host memory from malloc, through
 * the executor's pinned staging) against cudaMemcpy from and to pinned
 * memory, all of the same bytes in the same run.
 */
/* --gpu's figures (KVP_BENCH_JSON): each kernel against a D2D cudaMemcpy of its bytes. */
static void
gpu_kernel_json(uint32_t tokens, uint32_t n, const struct kvp_exec_bench *b)
{
	const char *name[] = {"gather", "scatter", "copy", "write_tokens"};
	double gbps[] = {b->gather_gbps, b->scatter_gbps, b->copy_gbps, b->write_tokens_gbps};
	for (int k = 0; k < 4; k++) {
		char row[160];
		snprintf(row, sizeof(row), "%s, %u blocks of %u tokens (%.0f MiB)", name[k], n, tokens,
		         (double)b->bytes / (1 << 20));
		bench_json("gpu", row, gbps[k] * 1e9, "B/s",
		           "device-to-device cudaMemcpy of the same bytes", b->d2d_gbps * 1e9, "higher");
	}
}

/* read_blocks / write_blocks (malloc'd host memory) against cudaMemcpy from pinned memory. */
static void
gpu_host_json(uint32_t tokens, unsigned threads, uint32_t n, const struct kvp_exec_bench *b,
              double read_gbps, double write_gbps)
{
	char row[160];
	snprintf(row, sizeof(row), "read_blocks to malloc'd memory, %u copy threads, %u blocks of "
	         "%u tokens (%.0f MiB)", threads, n, tokens, (double)b->bytes / (1 << 20));
	bench_json("gpu", row, read_gbps * 1e9, "B/s", "cudaMemcpy device to pinned host",
	           b->d2h_pinned_gbps * 1e9, "higher");
	snprintf(row, sizeof(row), "write_blocks from malloc'd memory, %u copy threads, %u blocks "
	         "of %u tokens (%.0f MiB)", threads, n, tokens, (double)b->bytes / (1 << 20));
	bench_json("gpu", row, write_gbps * 1e9, "B/s", "cudaMemcpy pinned host to device",
	           b->h2d_pinned_gbps * 1e9, "higher");
}

static int
bench_gpu(bool quick)
{
	static const uint32_t sizes[] = {16, 32};
	int iters = quick ? 3 : 20, dev = 0;
	char why[256];
	uint64_t f = 0, t = 0;
	int rv = kvp_exec_device_memory(dev, &f, &t);
	printf("## gpu: the cuda backend, 32 layers x 8 KV heads x 128, bf16\n\n");
	if (rv != KVP_OK) {
		printf("not run: %s\n\n", kvp_status_name(rv));
		return rv == KVP_ENODEVICE || rv == KVP_ENOTSUP ? 2 : 1; /* 2: nothing to run */
	}
	printf("device 0: %.1f GiB free of %.1f GiB\n\n", (double)f / (1u << 30),
	       (double)t / (1u << 30));
	for (size_t z = 0; z < N_SIZES(sizes); z++) {
		struct kvp_exec_config cfg = {
			.backend = KVP_EXEC_CUDA,
			.shape = {520, sizes[z], 32, 8, 128, KVP_DTYPE_BF16, KVP_LAYOUT_NHD}};
		struct kvp_exec *e;
		struct kvp_exec_bench b[3];
		if ((rv = kvp_exec_open(&cfg, &e, why, sizeof(why))) != KVP_OK) {
			printf("not run: %s (%s)\n\n", kvp_status_name(rv), why);
			return 1;
		}
		printf("### blocks of %u tokens (%llu KiB each)\n\n", sizes[z],
		       (unsigned long long)(kvp_exec_block_bytes(e) >> 10));
		printf("| blocks per call | bytes | gather | scatter | copy | write_tokens | D2D "
		       "cudaMemcpy | gather / D2D |\n|---|---|---|---|---|---|---|---|\n");
		for (uint32_t i = 0, n = 16; i < 3; i++, n *= 4) {
			if ((rv = kvp_exec_device_bench(e, n, iters, &b[i])) != KVP_OK) {
				printf("bench failed: %s (%s)\n", kvp_status_name(rv), kvp_exec_last_error(e));
				kvp_exec_close(e);
				return 1;
			}
			printf("| %u | %.0f MiB | %.0f GB/s | %.0f GB/s | %.0f GB/s | %.0f GB/s | %.0f GB/s "
			       "| %.2f |\n",
			       n, (double)b[i].bytes / (1 << 20), b[i].gather_gbps, b[i].scatter_gbps,
			       b[i].copy_gbps, b[i].write_tokens_gbps, b[i].d2d_gbps,
			       b[i].gather_gbps / b[i].d2d_gbps);
			gpu_kernel_json(sizes[z], n, &b[i]);
		}
		kvp_exec_close(e);
		printf("\nhost memory (malloc) to and from the device, GB/s, by the executor's copy "
		       "threads; the baselines are cudaMemcpy of the same bytes:\n\n"
		       "| copy threads | blocks per call | bytes | read_blocks | pinned D2H | ratio "
		       "| pageable D2H | write_blocks | pinned H2D | ratio | pageable H2D |\n"
		       "|---|---|---|---|---|---|---|---|---|---|---|\n");
		for (unsigned th = 1; th <= 8; th *= 2) {
			cfg.copy_threads = th;
			if ((rv = kvp_exec_open(&cfg, &e, why, sizeof(why))) != KVP_OK) {
				printf("not run: %s (%s)\n\n", kvp_status_name(rv), why);
				return 1;
			}
			for (uint32_t i = 0, n = 16; i < 3; i++, n *= 4) {
				unsigned char *buf = malloc(b[i].bytes);
				memset(buf, 3, b[i].bytes);
				double rd = host_call_s(e, true, n, buf, b[i].bytes, iters);
				double wr = host_call_s(e, false, n, buf, b[i].bytes, iters);
				free(buf);
				if (rd < 0 || wr < 0) {
					kvp_exec_close(e);
					return 1;
				}
				double rg = (double)b[i].bytes / rd / 1e9, wg = (double)b[i].bytes / wr / 1e9;
				printf("| %u | %u | %.0f MiB | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.2f "
				       "| %.1f |\n",
				       th, n, (double)b[i].bytes / (1 << 20), rg, b[i].d2h_pinned_gbps,
				       rg / b[i].d2h_pinned_gbps, b[i].d2h_pageable_gbps, wg,
				       b[i].h2d_pinned_gbps, wg / b[i].h2d_pinned_gbps, b[i].h2d_pageable_gbps);
				fflush(stdout);
				gpu_host_json(sizes[z], th, n, &b[i], rg, wg);
			}
			kvp_exec_close(e);
		}
		printf("\n");
	}
	return 0;
}

int
main(int argc, char **argv)
{
	const char *daemon = KVPOOLD_PATH;
	bool quick = false, gpu = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0)
			quick = true, seconds = 0.15;
		else if (strcmp(argv[i], "--gpu") == 0)
			gpu = true;
		else
			daemon = bench_daemon_arg("kvp-bench-executor", "[--quick] [--gpu] [KVPOOLD]", argv[i]);
	}
	printf("kvp-bench-executor: %.2f s per measurement%s\n\n", seconds, quick ? " (--quick)" : "");
	if (gpu) {
		int rv = bench_gpu(quick);
		return rv == 2 ? 0 : rv != 0 || bench_remote(daemon, quick, "cuda") != 0;
	}
	if (bench_local(quick) != 0)
		return 1;
	return bench_remote(daemon, quick, "cpu");
}
