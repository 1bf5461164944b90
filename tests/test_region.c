/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shared region through a real kvpoold over ipc: a writer process
 * reserves, writes in place and commits, a second process (this program
 * run again as "reader") looks up, locks and reads identical bytes through
 * its own mapping; a writer killed between Reserve and Commit (this
 * program as "crasher") leaves nothing visible and its rows come back after
 * its lease; a locked row survives memory pressure and is evicted after
 * Unlock; Abort publishes nothing; a peer without the token gets no
 * mapping and each pool has its own file; a retried call id applies once.
 */
#include "daemon_util.h"
#include <fcntl.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kvp_test.h"

#include "clients/c/kvpool.h"
#include "common/crc32c.h"
#include "kvpool.pb-c.h"

#define KL 36 /* sha256: 32-byte hash and a 4-byte group */
#define ROWS 16
#define TOKEN "region-token"

static char ipc_url[128], tcp_url[128], admin[64], token_path[128];
static pid_t daemon_pid;

/* Key i of a series: its hash bytes from (series, i), group g. */
static void
make_key(uint8_t *k, uint32_t series, uint32_t i, uint32_t g)
{
	for (int j = 0; j < 32; j++)
		k[j] = (uint8_t)(series * 131 + i * 17 + (uint32_t)j * 7 + 1);
	k[32] = (uint8_t)(g >> 24), k[33] = (uint8_t)(g >> 16), k[34] = (uint8_t)(g >> 8);
	k[35] = (uint8_t)g;
}

static void
make_keys(uint8_t *k, uint32_t series, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		make_key(k + i * KL, series, i, 0);
}

/* Row content for key (series, i): a pattern nobody else writes. */
static void
fill_row(unsigned char *row, size_t len, uint32_t series, uint32_t i)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (series * 1000 + i + 1);
	for (size_t j = 0; j < len; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		row[j] = (unsigned char)x;
	}
}

static struct kvp_client *
open_client(const char *pool, const char *token, uint32_t lease_ms)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = pool, .token = token,
	                               .timeout_ms = 5000, .retries = 1, .lease_ms = lease_ms};
	struct kvp_client *c = NULL;
	int rv = kvp_client_open(&o, &c);
	if (rv != KVP_OK)
		fail_msg("open %s: %s (%s)", pool, kvp_status_name(rv), kvp_client_open_detail());
	return c;
}

/* ---- helper processes: this program run as "reader" or "crasher" ---- */

/* Locks series keys 0..n-1, checks every row against its pattern and CRC, unlocks. */
static int
reader_main(uint32_t series, uint32_t n)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "kv", .token = TOKEN};
	struct kvp_client *c = NULL;
	struct kvp_region *r = NULL;
	uint8_t keys[ROWS * KL];
	int32_t rows[ROWS];
	uint32_t crcs[ROWS], hits = 0;
	static unsigned char want[1 << 16];
	int code = 0;

	if (kvp_client_open(&o, &c) != KVP_OK || kvp_region_open(c, &r) != KVP_OK) {
		code = 10;
		goto out;
	}
	make_keys(keys, series, n);
	if (kvp_client_lookup_lock(c, keys, n, false, rows, crcs, NULL, &hits) != KVP_OK ||
	    hits != n) {
		code = 11;
		goto out;
	}
	size_t rb = (size_t)kvp_region_info(r)->row_bytes;
	for (uint32_t i = 0; i < n && code == 0; i++) {
		fill_row(want, rb, series, i);
		if (memcmp(kvp_region_row(r, rows[i]), want, rb) != 0)
			code = 12;
		else if (!kvp_region_check(r, rows[i], crcs[i]))
			code = 13;
	}
	if (code == 0 && kvp_client_unlock(c, keys, n) != KVP_OK)
		code = 14;
out:
	kvp_region_close(r);
	kvp_client_close(c);
	return code;
}

/* Reserves series keys with a short lease, writes half, says so on stdout, and waits to die. */
static int
crasher_main(uint32_t series, uint32_t n)
{
	struct kvp_client_options o = {.url = ipc_url, .pool = "kv", .token = TOKEN,
	                               .lease_ms = 300};
	struct kvp_client *c = NULL;
	struct kvp_region *r = NULL;
	uint8_t keys[ROWS * KL];
	int32_t rows[ROWS];

	if (kvp_client_open(&o, &c) != KVP_OK || kvp_region_open(c, &r) != KVP_OK)
		return 10;
	make_keys(keys, series, n);
	if (kvp_client_reserve(c, keys, n, rows, NULL, NULL) != KVP_OK)
		return 11;
	for (uint32_t i = 0; i < n / 2; i++)
		fill_row(kvp_region_row(r, rows[i]), (size_t)kvp_region_info(r)->row_bytes, series, i);
	printf("reserved\n");
	fflush(stdout);
	for (;;)
		pause();
}

/* Runs this program as a helper; returns its pid, its stdout on *out_fd if asked. */
static pid_t
helper(const char *mode, uint32_t series, uint32_t n, int *out_fd)
{
	char s[16], k[16];
	int fds[2] = {-1, -1};
	snprintf(s, sizeof(s), "%u", series);
	snprintf(k, sizeof(k), "%u", n);
	if (out_fd)
		assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (out_fd) {
			dup2(fds[1], 1);
			close(fds[0]);
			close(fds[1]);
		}
		execl("/proc/self/exe", "test_region", mode, ipc_url, s, k, (char *)NULL);
		_exit(127);
	}
	if (out_fd) {
		close(fds[1]);
		*out_fd = fds[0];
	}
	return pid;
}

static int
wait_exit(pid_t pid)
{
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the tests ---- */

static void
test_region_two_processes_share_rows(void **state)
{
	(void)state;
	struct kvp_client *c = open_client("kv", TOKEN, 0);
	struct kvp_region *r = NULL;
	uint8_t keys[8 * KL];
	int32_t rows[8];

	assert_true(kvp_client_info(c)->region);
	assert_ok(kvp_region_open(c, &r));
	const struct kvp_region_info *ri = kvp_region_info(r);
	assert_int_equal(ri->num_rows, ROWS);
	assert_int_equal(ri->row_bytes, kvp_client_info(c)->executor.block_bytes);
	assert_int_equal(ri->row_stride % 4096, 0);
	assert_int_equal(ri->shards, 2);
	assert_int_equal(ri->shard_bytes * 2, ri->row_bytes);
	make_keys(keys, 1, 8);
	assert_ok(kvp_client_reserve(c, keys, 8, rows, NULL, NULL));
	for (int i = 0; i < 8; i++) {
		assert_true(rows[i] > 0);
		fill_row(kvp_region_row(r, rows[i]), (size_t)ri->row_bytes, 1, (uint32_t)i);
	}
	/* the other process sees nothing before the commit */
	assert_int_equal(wait_exit(helper("reader", 1, 8, NULL)), 11);
	assert_ok(kvp_client_commit(c, keys, 8, NULL, true));
	assert_int_equal(wait_exit(helper("reader", 1, 8, NULL)), 0);
	/* storing again: already stored, no row */
	assert_ok(kvp_client_reserve(c, keys, 8, rows, NULL, NULL));
	for (int i = 0; i < 8; i++)
		assert_int_equal(rows[i], -1);
	/* the nng data path reads the same bytes the region holds */
	uint32_t hits;
	uint32_t crcs[8];
	unsigned char *buf = malloc((size_t)ri->row_bytes);
	assert_ok(kvp_client_lookup_lock(c, keys, 1, false, rows, crcs, NULL, &hits));
	assert_ok(kvp_client_read_blocks(c, rows, 1, buf, (size_t)ri->row_bytes, NULL));
	assert_memory_equal(buf, kvp_region_row(r, rows[0]), (size_t)ri->row_bytes);
	assert_true(kvp_region_check(r, rows[0], crcs[0]));
	assert_ok(kvp_client_unlock(c, keys, 1));
	assert_status(kvp_client_unlock(c, keys, 1), KVP_ENOTOWNER);
	free(buf);
	kvp_region_close(r);
	kvp_client_close(c);
}

static void
test_region_crash_before_commit_leaves_nothing(void **state)
{
	(void)state;
	struct kvp_client *c = open_client("kv", TOKEN, 0);
	struct kvp_client_stats st0, st;
	uint8_t keys[4 * KL];
	int32_t rows[4];
	uint32_t hits = 9;
	char line[32] = "";
	int fd;

	assert_ok(kvp_client_stats(c, &st0));
	pid_t pid = helper("crasher", 2, 4, &fd);
	assert_true(read(fd, line, sizeof(line) - 1) > 0);
	close(fd);
	assert_non_null(strstr(line, "reserved"));
	make_keys(keys, 2, 4);
	assert_ok(kvp_client_stats(c, &st));
	assert_int_equal(st.num_free, st0.num_free - 4);
	/* reserved elsewhere: a miss here, and "already stored" for another writer */
	assert_ok(kvp_client_lookup_lock(c, keys, 4, false, rows, NULL, NULL, &hits));
	assert_int_equal(hits, 0);
	assert_ok(kvp_client_reserve(c, keys, 4, rows, NULL, NULL));
	assert_int_equal(rows[0], -1);
	kill(pid, SIGKILL);
	assert_int_equal(wait_exit(pid), 128 + SIGKILL);
	/* after its lease, the rows are free again and the keys were never seen */
	for (int i = 0; i < 100; i++) {
		assert_ok(kvp_client_stats(c, &st));
		if (st.num_free == st0.num_free)
			break;
		sleep_ms(50);
	}
	assert_int_equal(st.num_free, st0.num_free);
	assert_ok(kvp_client_lookup_lock(c, keys, 4, false, rows, NULL, NULL, &hits));
	assert_int_equal(hits, 0);
	assert_ok(kvp_client_reserve(c, keys, 4, rows, NULL, NULL));
	for (int i = 0; i < 4; i++)
		assert_true(rows[i] > 0);
	assert_ok(kvp_client_abort(c, keys, 4));
	assert_status(kvp_client_commit(c, keys, 4, NULL, true), KVP_ENOTFOUND);
	kvp_client_close(c);
}

static void
test_region_locked_row_survives_pressure(void **state)
{
	(void)state;
	struct kvp_client *w = open_client("kv", TOKEN, 0), *rd = open_client("kv", TOKEN, 0);
	struct kvp_client_stats st;
	uint8_t a[KL], keys[ROWS * KL], ev[ROWS * KL];
	int32_t row, rows[ROWS], arow;
	uint32_t hits;
	size_t ne;

	make_key(a, 3, 0, 0);
	assert_ok(kvp_client_reserve(w, a, 1, &row, NULL, NULL));
	assert_ok(kvp_client_commit(w, a, 1, NULL, true));
	assert_ok(kvp_client_lookup_lock(rd, a, 1, true, &arow, NULL, NULL, &hits));
	assert_int_equal(hits, 1);
	assert_int_equal(arow, row);
	/* fill every other row with new keys, twice over: A is never taken */
	assert_ok(kvp_client_stats(w, &st));
	uint32_t n = st.num_free;
	for (uint32_t round = 0; round < 2; round++) {
		make_keys(keys, 10 + round, n);
		assert_ok(kvp_client_reserve(w, keys, n, rows, NULL, NULL));
		for (uint32_t i = 0; i < n; i++)
			assert_true(rows[i] > 0 && rows[i] != arow);
		assert_ok(kvp_client_commit(w, keys, n, NULL, true));
	}
	make_keys(keys, 20, n + 1);
	assert_status(kvp_client_reserve(w, keys, n + 1, rows, NULL, NULL), KVP_ENOSPACE);
	assert_ok(kvp_client_unlock(rd, a, 1));
	/* unlocked, A is evictable again: the newest in the LRU, so evicted last */
	make_keys(keys, 21, n + 1);
	assert_ok(kvp_client_reserve(w, keys, n + 1, rows, ev, &ne));
	assert_int_equal(ne, n + 1);
	assert_memory_equal(ev + n * KL, a, KL);
	assert_ok(kvp_client_abort(w, keys, n + 1));
	kvp_client_close(rd);
	kvp_client_close(w);
}

static double
events_emitted(void)
{
	char series[128];
	snprintf(series, sizeof(series), "kvpool_events_emitted_total{pool=\"kv\"}");
	char buf[1 << 16];
	int port = atoi(strrchr(admin, ':') + 1);
	assert_true(http_get(port, "/metrics", buf, sizeof(buf)) > 0);
	const char *p = strstr(buf, series);
	assert_non_null(p);
	return atof(p + strlen(series));
}

static void
test_region_abort_publishes_nothing(void **state)
{
	(void)state;
	struct kvp_client *c = open_client("kv", TOKEN, 0);
	uint8_t keys[2 * KL];
	int32_t rows[2];

	make_keys(keys, 4, 2);
	double e0 = events_emitted();
	assert_ok(kvp_client_reserve(c, keys, 2, rows, NULL, NULL));
	assert_ok(kvp_client_abort(c, keys, 2));
	assert_true(events_emitted() == e0);
	assert_ok(kvp_client_reserve(c, keys, 2, rows, NULL, NULL));
	assert_ok(kvp_client_commit(c, keys, 2, NULL, true));
	assert_true(events_emitted() > e0);
	/* wrong shapes and states: clear statuses, nothing changes */
	assert_status(kvp_client_abort(c, keys, 2), KVP_ENOTFOUND);
	uint8_t dup[2 * KL];
	memcpy(dup, keys, KL);
	memcpy(dup + KL, keys, KL);
	int32_t r2[2];
	assert_status(kvp_client_lookup_lock(c, dup, 2, false, r2, NULL, NULL, NULL), KVP_EINVAL);
	kvp_client_close(c);
}

/*
 * A reservation is its session's: another session cannot take a reference
 * on the reserved row by its number (Touch), and so cannot commit or abort
 * it, nor read it; the reserver's own Commit then works.
 */
static void
test_region_reservation_belongs_to_its_session(void **state)
{
	(void)state;
	struct kvp_client *a = open_client("kv", TOKEN, 0), *b = open_client("kv", TOKEN, 0);
	uint8_t keys[KL];
	int32_t rows[1];

	make_keys(keys, 40, 1);
	assert_ok(kvp_client_reserve(a, keys, 1, rows, NULL, NULL));
	assert_true(rows[0] > 0);
	assert_status(kvp_client_touch(b, rows, 1), KVP_ENOTOWNER);
	assert_status(kvp_client_commit(b, keys, 1, NULL, true), KVP_ENOTOWNER);
	assert_status(kvp_client_abort(b, keys, 1), KVP_ENOTOWNER);
	assert_status(kvp_client_touch(a, rows, 1), KVP_ENOTOWNER); /* no second reference */
	assert_ok(kvp_client_commit(a, keys, 1, NULL, true));
	int32_t got[1];
	uint32_t hits = 0;
	assert_ok(kvp_client_lookup_lock(b, keys, 1, false, got, NULL, NULL, &hits));
	assert_int_equal(hits, 1);
	assert_int_equal(got[0], rows[0]);
	assert_ok(kvp_client_unlock(b, keys, 1));
	kvp_client_close(b);
	kvp_client_close(a);
}

/* Another session's Stats, timed while a large commit runs. */
struct watcher {
	struct kvp_client *c;
	_Atomic bool stop;
	double worst_s;
	unsigned calls;
};

static void *
watch_stats(void *arg)
{
	struct watcher *w = arg;
	struct kvp_client_stats st;
	while (!w->stop) {
		double t0 = now_s();
		if (kvp_client_stats(w->c, &st) != KVP_OK)
			break;
		double took = now_s() - t0;
		w->worst_s = took > w->worst_s ? took : w->worst_s;
		w->calls++;
		/*
		 * Paced: over the same-host channel a Stats takes microseconds, and
		 * thousands of them would hold the lock longer than the commit.
		 */
		nanosleep(&(struct timespec){0, 200000}, NULL);
	}
	return NULL;
}

/*
 * The daemon checksums a committed row (no checksum given) outside the
 * pool's lock: a commit of 128 MiB (64 rows of 2 MiB) does not hold another
 * session's calls for as long as its checksums take, and the rows read
 * back under those checksums.
 */
static void
test_region_commit_checksums_outside_the_lock(void **state)
{
	(void)state;
	struct kvp_client *a = open_client("big", NULL, 0);
	struct watcher w = {.c = open_client("big", NULL, 0)};
	struct kvp_region *r = NULL;
	enum { N = 64 };
	uint8_t keys[N * KL];
	int32_t rows[N];
	pthread_t t;

	make_keys(keys, 41, N);
	assert_ok(kvp_region_open(a, &r));
	size_t rb = (size_t)kvp_region_info(r)->row_bytes;
	assert_true(rb >= (2u << 20));
	assert_ok(kvp_client_reserve(a, keys, N, rows, NULL, NULL));
	for (int i = 0; i < N; i++)
		fill_row(kvp_region_row(r, rows[i]), rb, 41, (uint32_t)i);
	/* The commit's checksums alone, timed here: what a lock held through them would cost. */
	double c0 = now_s();
	for (int i = 0; i < N; i++)
		(void)kvp_crc32c(0, kvp_region_row(r, rows[i]), rb);
	double crc_s = now_s() - c0;
	assert_int_equal(pthread_create(&t, NULL, watch_stats, &w), 0);
	while (w.calls < 20)
		nanosleep(&(struct timespec){0, 1000000}, NULL);
	const char *held = "kvpool_pool_lock_held_seconds_total{pool=\"big\"}";
	double h0 = metric_value(held), t0 = now_s();
	assert_ok(kvp_client_commit(a, keys, N, NULL, true));
	double commit_s = now_s() - t0;
	w.stop = true;
	pthread_join(t, NULL);
	double held_s = metric_value(held) - h0;
	print_message("a %zu MiB commit took %.1f ms (its checksums %.1f ms); the pool's lock was "
	              "held %.2f ms meanwhile (the commit and %u Stats), one Stats took %.2f ms "
	              "at worst\n", (size_t)N * rb >> 20, commit_s * 1e3, crc_s * 1e3,
	              held_s * 1e3, w.calls, w.worst_s * 1e3);
	/* Held through the checksums, the lock would be held for at least their time. */
	assert_true(h0 >= 0 && held_s < crc_s / 4);
	/* The checksums are the rows' as written. */
	uint32_t crcs[N], hits = 0;
	int32_t got[N];
	assert_ok(kvp_client_lookup_lock(w.c, keys, N, false, got, crcs, NULL, &hits));
	assert_int_equal(hits, N);
	for (int i = 0; i < N; i++)
		assert_true(kvp_region_check(r, got[i], crcs[i]));
	assert_ok(kvp_client_unlock(w.c, keys, N));
	kvp_region_close(r);
	kvp_client_close(w.c);
	kvp_client_close(a);
}

static void
test_region_needs_the_token_and_its_pool(void **state)
{
	(void)state;
	struct kvp_client_options o = {.url = ipc_url, .pool = "kv", .timeout_ms = 2000};
	struct kvp_client *c = NULL, *kv, *other;
	struct kvp_region *r1 = NULL, *r2 = NULL;

	/* no token, or the wrong one: no session, so no Region call at all */
	assert_status(kvp_client_open(&o, &c), KVP_EUNAUTH);
	o.token = "not-it";
	assert_status(kvp_client_open(&o, &c), KVP_EUNAUTH);
	kv = open_client("kv", TOKEN, 0);
	other = open_client("other", NULL, 0);
	assert_ok(kvp_region_open(kv, &r1));
	assert_ok(kvp_region_open(other, &r2));
	assert_string_not_equal(kvp_region_info(r1)->path, kvp_region_info(r2)->path);
	assert_non_null(strstr(kvp_region_info(r1)->path, "kvpool-kv-"));
	/* the file is the daemon user's alone (ipc-mode 0600) */
	struct stat st;
	assert_int_equal(stat(kvp_region_info(r1)->path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	kvp_region_close(r1);
	kvp_region_close(r2);
	/* a pool without a region says so */
	struct kvp_client *bare = open_client("bare", NULL, 0);
	assert_status(kvp_region_open(bare, &r1), KVP_ENOTSUP);
	uint8_t k[KL];
	int32_t row;
	make_key(k, 5, 0, 0);
	assert_status(kvp_client_reserve(bare, k, 1, &row, NULL, NULL), KVP_ENOTSUP);
	kvp_client_close(bare);
	kvp_client_close(other);
	kvp_client_close(kv);
}

/*
 * The daemon names the file to map; whatever it names must be the region it
 * made, or nothing is mapped (so nothing written): here the region's path
 * is made to name an ordinary file of another user with the right size, a
 * second name of the region (a hard link), and a symbolic link.
 */
static void
test_region_maps_only_the_daemons_region(void **state)
{
	(void)state;
	struct kvp_client *c = open_client("other", NULL, 0);
	struct kvp_region *r = NULL;
	char path[4096], keep[4200];
	struct stat st;

	assert_ok(kvp_region_open(c, &r));
	snprintf(path, sizeof(path), "%s", kvp_region_info(r)->path);
	uint64_t bytes = kvp_region_info(r)->bytes;
	kvp_region_close(r);
	r = NULL;
	snprintf(keep, sizeof(keep), "%s.keep", path);
	assert_int_equal(rename(path, keep), 0);

	if (geteuid() == 0) {
		/* An impostor: a plain file of the right size, another user's. */
		int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0666);
		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
		assert_int_equal(fchown(fd, 65534, 65534), 0);
		close(fd);
		assert_status(kvp_region_open(c, &r), KVP_ENOTOWNER);
		assert_null(r);
		assert_non_null(strstr(kvp_client_last_detail(c), "another user"));
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_uid, 65534); /* untouched */
		assert_int_equal(unlink(path), 0);
	}
	/* The region under a second name. */
	assert_int_equal(link(keep, path), 0);
	assert_status(kvp_region_open(c, &r), KVP_ENOTOWNER);
	assert_non_null(strstr(kvp_client_last_detail(c), "hard links"));
	assert_int_equal(unlink(path), 0);
	/* A symbolic link to it. */
	assert_int_equal(symlink(keep, path), 0);
	assert_status(kvp_region_open(c, &r), KVP_ENOTFOUND);
	assert_int_equal(unlink(path), 0);

	assert_int_equal(rename(keep, path), 0);
	assert_ok(kvp_region_open(c, &r));
	assert_true(kvp_region_fd(r) >= 0);
	assert_int_equal(fstat(kvp_region_fd(r), &st), 0);
	assert_int_equal((uint64_t)st.st_size, bytes);
	kvp_region_close(r);
	kvp_client_close(c);
}

/*
 * A session's quota (the pool's session_rows, by default half a region's
 * rows; session_refs, references of any kind): one session that reserves,
 * locks or touches without end is refused QUOTA_EXCEEDED, counted, and the
 * pool still has room for another.
 */
static void
test_region_session_quota_leaves_room_for_others(void **state)
{
	(void)state;
	struct kvp_client *a = open_client("q", NULL, 0), *b = open_client("q", NULL, 0);
	const char *refused = "kvpool_quota_refusals_total{pool=\"q\"}";
	uint8_t keys[8 * KL], more[KL];
	int32_t rows[8];
	uint32_t hits;

	double q0 = metric_value(refused);
	assert_true(q0 >= 0);
	make_keys(keys, 61, 8); /* q has 8 rows: a session may hold 4 references */
	assert_status(kvp_client_reserve(a, keys, 5, rows, NULL, NULL), KVP_EQUOTA);
	assert_non_null(strstr(kvp_client_last_detail(a), "session_rows"));
	assert_ok(kvp_client_reserve(a, keys, 4, rows, NULL, NULL));
	make_key(more, 62, 0, 0);
	assert_status(kvp_client_reserve(a, more, 1, rows, NULL, NULL), KVP_EQUOTA);
	/* The other session still finds rows. */
	assert_ok(kvp_client_reserve(b, keys + 4 * KL, 4, rows + 4, NULL, NULL));
	assert_ok(kvp_client_abort(b, keys + 4 * KL, 4));
	/* Committed rows are no longer a's; locks count like reservations. */
	assert_ok(kvp_client_commit(a, keys, 4, NULL, false));
	assert_ok(kvp_client_lookup_lock(a, keys, 4, false, rows, NULL, NULL, &hits));
	assert_int_equal(hits, 4);
	assert_status(kvp_client_lookup_lock(a, keys, 1, false, rows, NULL, NULL, &hits), KVP_EQUOTA);
	assert_ok(kvp_client_lookup_lock(b, keys, 4, false, rows, NULL, NULL, &hits));
	assert_int_equal(hits, 4);
	assert_true(metric_value(refused) - q0 == 3);
	assert_ok(kvp_client_unlock(a, keys, 4));
	assert_ok(kvp_client_unlock(b, keys, 4));
	kvp_client_close(b);
	kvp_client_close(a);

	/* References of any kind: bare's session_refs is 6. */
	struct kvp_client *x = open_client("bare", NULL, 0), *y = open_client("bare", NULL, 0);
	int32_t ids[4], more_ids[4];
	assert_ok(kvp_client_allocate(x, 4, ids));
	assert_ok(kvp_client_touch(x, ids, 2));
	assert_status(kvp_client_touch(x, ids, 1), KVP_EQUOTA);
	assert_non_null(strstr(kvp_client_last_detail(x), "session_refs"));
	assert_ok(kvp_client_allocate(y, 3, more_ids)); /* the other session is served */
	kvp_client_close(y);
	kvp_client_close(x);
}

/*
 * kvp_client_renew: a new session in one round trip, the old one ended by
 * it (what it had reserved is free again, its id refused), the client's
 * calls going on in the new one.
 */
static void
test_region_renew_replaces_the_session_in_one_call(void **state)
{
	(void)state;
	struct kvp_client *a = open_client("q", NULL, 0), *again = NULL;
	struct kvp_client_stats st;
	uint8_t keys[2 * KL];
	int32_t rows[2];

	assert_ok(kvp_client_stats(a, &st));
	uint32_t free0 = st.num_free;
	uint64_t old = kvp_client_info(a)->session_id;
	make_keys(keys, 63, 2);
	assert_ok(kvp_client_reserve(a, keys, 2, rows, NULL, NULL));
	assert_status(kvp_client_renew(NULL), KVP_EINVAL);
	assert_ok(kvp_client_renew(a));
	assert_int_not_equal(kvp_client_info(a)->session_id, old);
	assert_ok(kvp_client_stats(a, &st));
	assert_int_equal(st.num_free, free0); /* the old session's reservations went with it */
	struct kvp_client_options o = {.url = ipc_url, .pool = "q", .timeout_ms = 2000,
	                               .session_id = old};
	assert_status(kvp_client_open(&o, &again), KVP_EUNAUTH);
	assert_ok(kvp_client_reserve(a, keys, 2, rows, NULL, NULL));
	assert_ok(kvp_client_abort(a, keys, 2));
	kvp_client_close(a);
}

/*
 * The region's calls in a batch (a scheduler step in one round trip): each
 * has its own status and results; a Commit there carries its checksums
 * or none, since the daemon's own are taken outside the lock.
 */
static void
test_region_calls_batch_in_one_round_trip(void **state)
{
	(void)state;
	struct kvp_client *a = open_client("q", NULL, 0);
	struct kvp_batch *b = NULL;
	struct kvp_batch_result r;
	uint8_t keys[3 * KL];
	uint32_t crcs[3] = {7, 8, 9};
	size_t kl = kvp_client_key_len(a);

	assert_int_equal(kl, KL);
	make_keys(keys, 64, 3);
	assert_ok(kvp_batch_create(&b));
	assert_ok(kvp_batch_set_flags(b, KVP_BATCH_CONTINUE));
	assert_status(kvp_batch_reserve(b, NULL, 3, kl), KVP_EINVAL);
	assert_status(kvp_batch_reserve(b, keys, 3, 3), KVP_EINVAL);
	assert_ok(kvp_batch_reserve(b, keys, 3, kl));
	assert_ok(kvp_batch_lookup_lock(b, keys, 3, kl, false)); /* reserved: not visible */
	assert_ok(kvp_batch_commit(b, keys, 2, kl, crcs));
	assert_ok(kvp_batch_abort(b, keys + 2 * KL, 1, kl));
	assert_ok(kvp_batch_lookup_lock(b, keys, 3, kl, false));
	size_t ran = 0;
	assert_ok(kvp_client_batch(a, b, &ran));
	assert_int_equal(ran, 5);
	assert_ok(kvp_batch_result(b, 0, &r));
	assert_int_equal(r.status, KVP_OK);
	assert_int_equal(r.num_block_ids, 3);
	assert_true(r.block_ids[0] > 0 && r.block_ids[1] > 0 && r.block_ids[2] > 0);
	assert_ok(kvp_batch_result(b, 1, &r));
	assert_int_equal(r.count, 0);
	assert_ok(kvp_batch_result(b, 2, &r));
	assert_int_equal(r.count, 2);
	assert_ok(kvp_batch_result(b, 4, &r));
	assert_int_equal(r.count, 2);
	assert_int_equal(r.num_block_ids, 3);
	assert_non_null(r.ref_cnts);
	assert_int_equal(r.ref_cnts[0], 7); /* the CRC32C given at commit */
	assert_int_equal(r.ref_cnts[1], 8);
	assert_int_equal(r.block_ids[2], -1); /* aborted */
	/* The unlocks of the same step, and a Commit of nothing reserved: its own status. */
	kvp_batch_clear(b);
	assert_ok(kvp_batch_unlock(b, keys, 2, kl));
	assert_ok(kvp_batch_commit(b, keys, 1, kl, NULL));
	assert_status(kvp_client_batch(a, b, &ran), KVP_ENOTFOUND);
	assert_int_equal(ran, 2);
	assert_ok(kvp_batch_result(b, 0, &r));
	assert_int_equal(r.status, KVP_OK);
	assert_ok(kvp_batch_result(b, 1, &r));
	assert_int_equal(r.status, KVP_ENOTFOUND);
	kvp_batch_destroy(b);
	kvp_client_close(a);
}

/* The free queue's read-only view: pages, and a cursor that is no longer free. */
static void
test_region_free_queue_view(void **state)
{
	(void)state;
	struct kvp_client *c = open_client("other", NULL, 0);
	int32_t ids[8], got[8];
	size_t n = 0;
	bool more = false;

	assert_status(kvp_client_free_queue(NULL, 0, ids, 8, &n, &more), KVP_EINVAL);
	assert_status(kvp_client_free_queue(c, -1, ids, 8, &n, &more), KVP_EINVAL);
	assert_status(kvp_client_free_queue(c, 0, NULL, 8, &n, &more), KVP_EINVAL);
	assert_status(kvp_client_free_queue(c, 1000, ids, 8, &n, &more), KVP_ERANGE);
	assert_ok(kvp_client_free_queue(c, 0, ids, 8, &n, &more));
	assert_int_equal(n, 3); /* 4 blocks, the null one never free */
	assert_false(more);
	assert_ok(kvp_client_free_queue(c, 0, got, 2, &n, &more));
	assert_int_equal(n, 2);
	assert_true(more);
	assert_ok(kvp_client_free_queue(c, got[1], got + 2, 2, &n, &more));
	assert_int_equal(n, 1);
	assert_false(more);
	assert_memory_equal(got, ids, 3 * sizeof(*ids));
	int32_t b;
	assert_ok(kvp_client_allocate(c, 1, &b));
	assert_status(kvp_client_free_queue(c, b, got, 2, &n, &more), KVP_ENOTFOUND);
	assert_ok(kvp_client_free(c, &b, 1));
	kvp_client_close(c);
}

/* kvpoolctl region [ROW]: the region's shape, and a row's checksum as the reader sees it. */
static void
test_region_kvpoolctl_shows_region_and_row(void **state)
{
	(void)state;
	struct kvp_client *c = open_client("kv", TOKEN, 0);
	struct kvp_region *r = NULL;
	uint8_t k[KL];
	int32_t row;
	uint32_t crc, hits;
	char cmd[1024], out[8192] = "", want[64];
	FILE *f;

	assert_ok(kvp_region_open(c, &r));
	make_key(k, 30, 0, 0);
	assert_ok(kvp_client_reserve(c, k, 1, &row, NULL, NULL));
	fill_row(kvp_region_row(r, row), (size_t)kvp_region_info(r)->row_bytes, 30, 0);
	assert_ok(kvp_client_commit(c, k, 1, NULL, true));
	assert_ok(kvp_client_lookup_lock(c, k, 1, false, &row, &crc, NULL, &hits));
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv --token-file %s --json region %d",
	         KVPOOLCTL_PATH, ipc_url, token_path, row);
	assert_non_null(f = popen(cmd, "r"));
	size_t n = fread(out, 1, sizeof(out) - 1, f);
	assert_int_equal(pclose(f), 0);
	out[n] = '\0';
	assert_non_null(strstr(out, kvp_region_info(r)->path));
	snprintf(want, sizeof(want), "\"crc32c\":%u", crc);
	if (strstr(out, want) == NULL)
		fail_msg("no %s in %s", want, out);
	/* a row outside the region: refused with exit 1; a bad word: usage, exit 2 */
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv --token-file %s region 99999 2>/dev/null",
	         KVPOOLCTL_PATH, ipc_url, token_path);
	assert_int_equal(WEXITSTATUS(system(cmd)), 1);
	snprintf(cmd, sizeof(cmd), "%s --url %s --pool kv region x 2>/dev/null", KVPOOLCTL_PATH,
	         ipc_url);
	assert_int_equal(WEXITSTATUS(system(cmd)), 2);
	assert_ok(kvp_client_unlock(c, k, 1));
	kvp_region_close(r);
	kvp_client_close(c);
}

/* kvp_copy_many: every piece lands, on one thread or several, and NULLs are refused. */
static void
test_region_copy_many_copies_every_piece(void **state)
{
	(void)state;
	enum { N = 96, PIECE = 65536 + 7 }; /* over 4 MiB in all: the threaded path */
	unsigned char *a = malloc((size_t)N * PIECE), *b = malloc((size_t)N * PIECE);
	void *dst[N];
	const void *src[N];
	uint64_t len[N];
	assert_non_null(a);
	assert_non_null(b);
	for (unsigned threads = 1; threads <= 4; threads += 3) {
		fill_row(a, (size_t)N * PIECE, 40, threads);
		memset(b, 0, (size_t)N * PIECE);
		for (int i = 0; i < N; i++) { /* scattered: piece i to slot N-1-i */
			src[i] = a + (size_t)i * PIECE;
			dst[i] = b + (size_t)(N - 1 - i) * PIECE;
			len[i] = PIECE - (uint64_t)(i % 3);
		}
		assert_ok(kvp_copy_many(dst, src, len, N, threads));
		for (int i = 0; i < N; i++)
			assert_memory_equal(dst[i], src[i], (size_t)len[i]);
	}
	assert_status(kvp_copy_many(NULL, src, len, 1, 1), KVP_EINVAL);
	assert_ok(kvp_copy_many(NULL, NULL, NULL, 0, 4));
	free(a);
	free(b);
}

/* A Reserve and a Commit sent twice with one call id take effect once. */
static void
test_region_retried_call_applies_once(void **state)
{
	(void)state;
	nng_socket s;
	uint8_t buf[4096], keys[2 * KL];
	struct kvp_client *c = open_client("kv", TOKEN, 0);
	struct kvp_client_stats st0, st;

	assert_int_equal(nng_req0_open(&s), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000), 0);
	assert_int_equal(nng_dial(s, ipc_url, NULL, 0), 0);
	Kvpool__V1__Request rq = KVPOOL__V1__REQUEST__INIT;
	Kvpool__V1__HelloRequest h = KVPOOL__V1__HELLO_REQUEST__INIT;
	h.protocol_version = 1;
	h.auth_token = TOKEN;
	rq.pool = "kv";
	rq.call_case = KVPOOL__V1__REQUEST__CALL_HELLO;
	rq.hello = &h;
	Kvpool__V1__Reply *r[2];
	for (int k = 0; k < 1; k++) {
		size_t n = kvpool__v1__request__pack(&rq, buf);
		void *rb;
		size_t rl;
		assert_int_equal(nng_send(s, buf, n, 0), 0);
		assert_int_equal(nng_recv(s, &rb, &rl, NNG_FLAG_ALLOC), 0);
		r[0] = kvpool__v1__reply__unpack(NULL, rl, rb);
		nng_free(rb, rl);
	}
	assert_int_equal(r[0]->status, 0);
	uint64_t sid = r[0]->hello->session_id;
	kvpool__v1__reply__free_unpacked(r[0], NULL);

	assert_ok(kvp_client_stats(c, &st0));
	make_keys(keys, 6, 2);
	Kvpool__V1__ReserveRequest res = KVPOOL__V1__RESERVE_REQUEST__INIT;
	Kvpool__V1__CommitRequest com = KVPOOL__V1__COMMIT_REQUEST__INIT;
	res.keys.data = keys;
	res.keys.len = sizeof(keys);
	com.keys = res.keys;
	Kvpool__V1__Request a = KVPOOL__V1__REQUEST__INIT;
	a.pool = "kv";
	a.session_id = sid;
	a.token.data = (uint8_t *)TOKEN;
	a.token.len = strlen(TOKEN);
	for (int call = 0; call < 2; call++) {
		a.call_id = 900 + (uint64_t)call;
		a.call_case = call ? KVPOOL__V1__REQUEST__CALL_COMMIT : KVPOOL__V1__REQUEST__CALL_RESERVE;
		if (call)
			a.commit = &com;
		else
			a.reserve = &res;
		size_t n = kvpool__v1__request__pack(&a, buf);
		for (int k = 0; k < 2; k++) {
			void *rb;
			size_t rl;
			assert_int_equal(nng_send(s, buf, n, 0), 0);
			assert_int_equal(nng_recv(s, &rb, &rl, NNG_FLAG_ALLOC), 0);
			r[k] = kvpool__v1__reply__unpack(NULL, rl, rb);
			nng_free(rb, rl);
			assert_non_null(r[k]);
			assert_int_equal(r[k]->status, KVP_OK);
		}
		if (call == 0) {
			assert_int_equal(r[1]->reserve->n_rows, 2);
			assert_memory_equal(r[0]->reserve->rows, r[1]->reserve->rows, 2 * sizeof(int32_t));
			assert_ok(kvp_client_stats(c, &st));
			assert_int_equal(st.num_free, st0.num_free - 2); /* reserved once */
		}
		kvpool__v1__reply__free_unpacked(r[0], NULL);
		kvpool__v1__reply__free_unpacked(r[1], NULL);
	}
	uint32_t hits;
	int32_t rows[2];
	assert_ok(kvp_client_lookup_lock(c, keys, 2, false, rows, NULL, NULL, &hits));
	assert_int_equal(hits, 2);
	assert_ok(kvp_client_unlock(c, keys, 2));
	nng_close(s);
	kvp_client_close(c);
}

static int
setup(void **state)
{
	(void)state;
	daemon_urls(ipc_url, sizeof(ipc_url), tcp_url, sizeof(tcp_url));
	snprintf(admin, sizeof(admin), "http://127.0.0.1:%d", daemon_admin_port());
	snprintf(token_path, sizeof(token_path), "/tmp/kvpool-region-token-%d", (int)getpid());
	FILE *f = fopen(token_path, "w");
	if (f == NULL)
		return -1;
	fputs(TOKEN "\n", f);
	fclose(f);
	char ev[128], kv[256];
	snprintf(ev, sizeof(ev), "ipc:///tmp/kvpool-regiontest-pub-%d.ipc", (int)getpid());
	/* kv and big: one session fills them on purpose (session_rows: its whole pool) */
	snprintf(kv, sizeof(kv), "name=kv,blocks=%d,block_size=16,executor=cpu,shards=2,"
	         "session_rows=%d,token_file=%s", ROWS, ROWS, token_path);
	const char *args[] = {"--rpc", ipc_url, "--events", ev, "--admin", admin,
	                      "--kv-layers", "2", "--kv-heads", "4", "--kv-head-size", "32",
	                      "--region-dir", getenv("TMPDIR") && *getenv("TMPDIR")
	                                          ? getenv("TMPDIR") : "/tmp",
	                      "--lease-ms", "5000",
	                      "--pool", kv, "--pool", "name=other,blocks=4,executor=cpu",
	                      "--pool", "name=big,blocks=72,block_size=16,executor=cpu,layers=32,"
	                      "heads=8,head_size=128,dtype=fp16,session_rows=72",
	                      "--pool", "name=q,blocks=9,block_size=16,executor=cpu",
	                      "--pool", "name=bare,blocks=8,executor=none,session_refs=6", NULL};
	daemon_pid = daemon_start(args);
	return daemon_pid > 0 ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	unlink(token_path);
	return daemon_stop(daemon_pid) == 0 ? 0 : -1;
}

int
main(int argc, char **argv)
{
	if (argc == 5 && (strcmp(argv[1], "reader") == 0 || strcmp(argv[1], "crasher") == 0)) {
		snprintf(ipc_url, sizeof(ipc_url), "%s", argv[2]);
		uint32_t series = (uint32_t)atoi(argv[3]), n = (uint32_t)atoi(argv[4]);
		if (n > ROWS)
			return 2;
		return argv[1][0] == 'r' ? reader_main(series, n) : crasher_main(series, n);
	}
	/* The helpers are exec'd (nng is not fork-safe): the first test forks before any nng call. */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_region_two_processes_share_rows),
		cmocka_unit_test(test_region_maps_only_the_daemons_region),
		cmocka_unit_test(test_region_session_quota_leaves_room_for_others),
		cmocka_unit_test(test_region_renew_replaces_the_session_in_one_call),
		cmocka_unit_test(test_region_calls_batch_in_one_round_trip),
		cmocka_unit_test(test_region_free_queue_view),
		cmocka_unit_test(test_region_crash_before_commit_leaves_nothing),
		cmocka_unit_test(test_region_locked_row_survives_pressure),
		cmocka_unit_test(test_region_abort_publishes_nothing),
		cmocka_unit_test(test_region_reservation_belongs_to_its_session),
		cmocka_unit_test(test_region_commit_checksums_outside_the_lock),
		cmocka_unit_test(test_region_needs_the_token_and_its_pool),
		cmocka_unit_test(test_region_retried_call_applies_once),
		cmocka_unit_test(test_region_kvpoolctl_shows_region_and_row),
		cmocka_unit_test(test_region_copy_many_copies_every_piece),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
