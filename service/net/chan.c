/* SPDX-License-Identifier: Apache-2.0 */
/* kvpoold's same-host call channels: chan.h, common/shm_chan.h. */
#define _GNU_SOURCE /* memfd_create, accept4 */
#include "service/net/chan.h"

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "common/shm_chan.h"
#include "service/log.h"
#include "service/net/refusal.h"
#include "service/pool/server.h"

/* How long a channel's thread sleeps before it looks whether its client is still there. */
enum { IDLE_LOOK_MS = 100, HELLO_MS = 200 };

/*
 * How long each side spins before it sleeps. A request or reply that finds
 * the other side asleep waits for a wake-up (futex), measured at 50-150 µs
 * on a VM's idle vCPU, more than most calls take. A channel is hot while
 * its client calls again within HOT_GAP_NS of its replies (a scheduler's
 * calls within a step, or steps with no model to run) and its thread has
 * not slept since. While at most max_hot channels are hot (a quarter of the
 * CPUs, one at least), a hot channel's thread spins up to 1.5 times its
 * recent gaps (at most HOT_GAP_NS), and every reply tells its client it may
 * spin for its replies (spin_ok: clients/c/chan.c); with more, everyone
 * spins SPIN_NS, since spinners would take the CPUs the calls need (50
 * busy peers on 2 CPUs raised an honest client's p99 30-fold).
 */
#define SPIN_NS 20000ull
#define HOT_GAP_NS 1000000ull

struct chan {
	struct kvpd_chans *cs;
	int sock;
	unsigned char *map;
	size_t map_len;
	unsigned char *copy; /* the request, out of the peer's reach while it is served */
	char peer[48], conn[24]; /* for the log: "shm pid N" (SO_PEERCRED), "shm-N" */
	pthread_t thread;
	atomic_bool done;
	struct chan *next;
};

struct kvpd_chans {
	struct kvpd_server *srv;
	int lfd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	size_t area;
	uint32_t max;
	atomic_uint open;
	atomic_uint hot;  /* hot channels now (see SPIN_NS) */
	unsigned max_hot; /* the most that spin long */
	atomic_uint_fast64_t served;
	atomic_bool stop;
	pthread_t acceptor;
	bool started;
	pthread_mutex_t mu; /* the list, the log's limits */
	struct chan *list;
	uint64_t opened;
	struct kvpd_log_limit refusal_log[KVPD_NUM_REFUSALS];
};

struct sink_ctx {
	unsigned char *rep;
	size_t area;
};

/* The reply goes straight into the reply area; one that does not fit is refused (NULL). */
static void *
area_sink(void *ctx, size_t len)
{
	struct sink_ctx *s = ctx;
	return len <= s->area ? s->rep : NULL;
}

/* Whether the client has gone: its socket closed (or sent what it should not). */
static bool
client_gone(int sock)
{
	struct pollfd p = {.fd = sock, .events = POLLIN};
	return poll(&p, 1, 0) != 0;
}

/* Whether few enough channels are hot for the hot ones to spin long. */
static bool
few_hot(struct kvpd_chans *cs)
{
	return atomic_load(&cs->hot) <= cs->max_hot;
}

/* Marks the channel hot or not (*hot), counting it in cs->hot. */
static void
set_hot(struct kvpd_chans *cs, bool *hot, bool to)
{
	if (*hot != to) {
		*hot = to;
		if (to)
			atomic_fetch_add(&cs->hot, 1);
		else
			atomic_fetch_sub(&cs->hot, 1);
	}
}

/*
 * The client's next request (its sequence number), or seen if none came
 * while spinning: for SPIN_NS, or on a hot channel while few are (gap_ns,
 * its recent gaps) up to 1.5 gap_ns.
 */
static uint32_t
spin_for(struct kvpd_chans *cs, struct kvp_chan_hdr *h, uint32_t seen, bool hot, uint64_t gap_ns)
{
	uint64_t spin = SPIN_NS;

	if (hot && few_hot(cs)) {
		spin = gap_ns + gap_ns / 2 < HOT_GAP_NS ? gap_ns + gap_ns / 2 : HOT_GAP_NS;
		spin = spin < SPIN_NS ? SPIN_NS : spin;
	}
	return kvp_chan_spin(&h->req_seq, seen, kvp_mono_ns(), spin);
}

static void *
chan_main(void *arg)
{
	struct chan *ch = arg;
	struct kvpd_chans *cs = ch->cs;
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)ch->map;
	uint32_t seen = 0; /* the memfd starts zeroed: a request sent before this thread ran is seq 1 */
	struct sink_ctx sc = {.rep = kvp_chan_rep(ch->map, cs->area), .area = cs->area};
	uint64_t replied = 0, gap_ns = 0; /* the last reply's time; the gaps after replies */
	bool hot = false;

	while (!atomic_load(&cs->stop)) {
		uint32_t now = spin_for(cs, h, seen, hot, gap_ns);
		if (now == seen) {
			set_hot(cs, &hot, false); /* its client is slower than its gaps said */
			if (kvp_futex_wait(&h->req_seq, seen, IDLE_LOOK_MS) != 0 && client_gone(ch->sock))
				break;
			if (atomic_load(&h->req_seq) == seen && client_gone(ch->sock))
				break;
			continue;
		}
		seen = now;
		if (replied != 0) {
			uint64_t gap = kvp_mono_ns() - replied;
			gap_ns = gap_ns == 0 ? gap : (3 * gap_ns + gap) / 4;
			set_hot(cs, &hot, gap_ns < HOT_GAP_NS);
		}
		uint32_t len = atomic_load(&h->req_len);
		if (len > cs->area)
			len = 0; /* a length past the area: an empty request, refused as malformed */
		memcpy(ch->copy, kvp_chan_req(ch->map), len);
		struct kvpd_sink sink = {.alloc = area_sink, .ctx = &sc};
		int rv = kvpd_server_handle_to(cs->srv, ch->copy, len, (uint64_t)nng_clock(), &sink);
		atomic_store(&h->rep_len, rv == KVP_OK && sink.buf != NULL ? (uint32_t)sink.len : 0);
		atomic_store(&h->spin_ok, few_hot(cs) ? 1u : 0u);
		atomic_store(&h->rep_seq, seen);
		kvp_futex_wake(&h->rep_seq);
		replied = kvp_mono_ns();
		atomic_fetch_add(&cs->served, 1);
		if (sink.refusal) {
			pthread_mutex_lock(&cs->mu);
			kvpd_log_refusal(cs->refusal_log, ch->peer, ch->conn, &sink);
			pthread_mutex_unlock(&cs->mu);
		}
		kvpd_server_count_shm(cs->srv, 0, 1);
	}
	set_hot(cs, &hot, false);
	kvpd_server_count_shm(cs->srv, -1, 0);
	atomic_store(&ch->done, true);
	return NULL;
}

static void
chan_free(struct chan *ch)
{
	if (ch->map != NULL)
		munmap(ch->map, ch->map_len);
	if (ch->sock >= 0)
		close(ch->sock);
	free(ch->copy);
	free(ch);
}

/* Joins and frees the channels whose threads have ended (all of them with every). */
static void
reap(struct kvpd_chans *cs, bool every)
{
	pthread_mutex_lock(&cs->mu);
	for (struct chan **pp = &cs->list; *pp != NULL;) {
		struct chan *ch = *pp;
		if (!every && !atomic_load(&ch->done)) {
			pp = &ch->next;
			continue;
		}
		*pp = ch->next;
		pthread_join(ch->thread, NULL);
		atomic_fetch_sub(&cs->open, 1);
		chan_free(ch);
	}
	pthread_mutex_unlock(&cs->mu);
}

/* A client at sock asked: its hello, then the memfd, then its thread. Closes sock on failure. */
static void
start_chan(struct kvpd_chans *cs, int sock)
{
	char hello[8];
	struct timeval tv = {HELLO_MS / 1000, (HELLO_MS % 1000) * 1000};
	struct chan *ch = NULL;
	int fd = -1;

	(void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (atomic_load(&cs->open) >= cs->max || recv(sock, hello, sizeof(hello), MSG_WAITALL) !=
	        (ssize_t)sizeof(hello) || memcmp(hello, KVP_CHAN_HELLO, sizeof(hello)) != 0 ||
	    (ch = calloc(1, sizeof(*ch))) == NULL)
		goto fail;
	ch->cs = cs;
	ch->sock = sock;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
		snprintf(ch->peer, sizeof(ch->peer), "shm pid %d", (int)cred.pid);
	else
		snprintf(ch->peer, sizeof(ch->peer), "shm");
	ch->map_len = KVP_CHAN_HDR + 2 * cs->area;
	if ((ch->copy = malloc(cs->area ? cs->area : 1)) == NULL ||
	    (fd = memfd_create("kvpool-chan", MFD_CLOEXEC)) < 0 ||
	    ftruncate(fd, (off_t)ch->map_len) != 0)
		goto fail;
	ch->map = mmap(NULL, ch->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ch->map == MAP_FAILED) {
		ch->map = NULL;
		goto fail;
	}
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)ch->map;
	h->magic = KVP_CHAN_MAGIC;
	h->area = cs->area;
	/* The descriptor and the area size, in one message. */
	uint64_t area = cs->area;
	struct iovec iov = {.iov_base = &area, .iov_len = sizeof(area)};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                   .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(sock, &m, MSG_NOSIGNAL) != (ssize_t)sizeof(area))
		goto fail;
	close(fd);
	fd = -1;
	pthread_mutex_lock(&cs->mu);
	snprintf(ch->conn, sizeof(ch->conn), "shm-%llu", (unsigned long long)++cs->opened);
	kvpd_server_count_shm(cs->srv, 1, 0); /* before the thread, whose end counts -1 */
	if (pthread_create(&ch->thread, NULL, chan_main, ch) != 0) {
		kvpd_server_count_shm(cs->srv, -1, 0);
		pthread_mutex_unlock(&cs->mu);
		goto fail;
	}
	ch->next = cs->list;
	cs->list = ch;
	atomic_fetch_add(&cs->open, 1);
	pthread_mutex_unlock(&cs->mu);
	return;
fail:
	if (fd >= 0)
		close(fd);
	if (ch != NULL)
		chan_free(ch); /* closes sock */
	else
		close(sock);
}

static void *
accept_main(void *arg)
{
	struct kvpd_chans *cs = arg;
	while (!atomic_load(&cs->stop)) {
		struct pollfd p = {.fd = cs->lfd, .events = POLLIN};
		reap(cs, false);
		if (poll(&p, 1, IDLE_LOOK_MS) <= 0)
			continue;
		int s = accept4(cs->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (s >= 0)
			start_chan(cs, s);
	}
	return NULL;
}

int
kvpd_chans_open(struct kvpd_server *srv, const char *ipc_path, uint32_t mode, uint32_t max,
                size_t area, struct kvpd_chans **out, char *err, size_t err_len)
{
	struct kvpd_chans *cs;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	struct stat st;

	if (srv == NULL || ipc_path == NULL || out == NULL || max == 0 || area == 0 ||
	    area > UINT32_MAX) {
		snprintf(err, err_len, "same-host channels: bad arguments");
		return KVP_EINVAL;
	}
	if ((cs = calloc(1, sizeof(*cs))) == NULL) {
		snprintf(err, err_len, "out of memory");
		return KVP_ENOMEM;
	}
	cs->srv = srv;
	cs->lfd = -1;
	cs->max = max;
	cs->area = area;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	cs->max_hot = cpus / 4 > 1 ? (unsigned)(cpus / 4) : 1u;
	for (int k = 0; k < KVPD_NUM_REFUSALS; k++)
		cs->refusal_log[k] = (struct kvpd_log_limit){.per_window = 5, .window_ms = 1000};
	pthread_mutex_init(&cs->mu, NULL);
	if ((size_t)snprintf(cs->path, sizeof(cs->path), "%s.shm", ipc_path) >= sizeof(cs->path) ||
	    (size_t)snprintf(a.sun_path, sizeof(a.sun_path), "%s", cs->path) >= sizeof(a.sun_path)) {
		snprintf(err, err_len, "%.200s.shm: too long for a unix socket", ipc_path);
		goto fail;
	}
	/* A socket an earlier life left goes; anything else there is not ours to remove. */
	if (lstat(cs->path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode) || unlink(cs->path) != 0) {
			snprintf(err, err_len, "%.200s exists and is not a socket kvpoold may replace",
			         cs->path);
			goto fail;
		}
	}
	if ((cs->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(cs->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    chmod(cs->path, (mode_t)(mode & 0777)) != 0 || listen(cs->lfd, 64) != 0) {
		snprintf(err, err_len, "cannot listen on %.200s", cs->path);
		goto fail;
	}
	if (pthread_create(&cs->acceptor, NULL, accept_main, cs) != 0) {
		snprintf(err, err_len, "cannot start a thread");
		goto fail;
	}
	cs->started = true;
	*out = cs;
	return KVP_OK;
fail:
	kvpd_chans_close(cs);
	return KVP_EINTERNAL;
}

uint32_t
kvpd_chans_open_count(const struct kvpd_chans *cs)
{
	return cs ? atomic_load(&((struct kvpd_chans *)cs)->open) : 0;
}

uint64_t
kvpd_chans_served(const struct kvpd_chans *cs)
{
	return cs ? atomic_load(&((struct kvpd_chans *)cs)->served) : 0;
}

void
kvpd_chans_close(struct kvpd_chans *cs)
{
	if (cs == NULL)
		return;
	atomic_store(&cs->stop, true);
	if (cs->started)
		pthread_join(cs->acceptor, NULL);
	/* Each thread sees stop within its wait; wake the sleeping ones now. */
	pthread_mutex_lock(&cs->mu);
	for (struct chan *ch = cs->list; ch != NULL; ch = ch->next)
		kvp_futex_wake(&((struct kvp_chan_hdr *)ch->map)->req_seq);
	pthread_mutex_unlock(&cs->mu);
	reap(cs, true);
	if (cs->lfd >= 0) {
		close(cs->lfd);
		if (cs->path[0] != '\0')
			unlink(cs->path);
	}
	pthread_mutex_destroy(&cs->mu);
	free(cs);
}
