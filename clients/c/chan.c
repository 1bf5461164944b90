/* SPDX-License-Identifier: Apache-2.0 */
/* The C client's same-host call channel: chan.h, common/shm_chan.h. */
#define _GNU_SOURCE /* struct ucred */
#include "clients/c/chan.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nng/supplemental/util/platform.h>

#include "common/kvp_status.h"
#include "common/shm_chan.h"

/* While it waits for a reply, how often the client looks whether the daemon is still there. */
enum { LOOK_MS = 50 };

/*
 * How long a call spins for its reply before it sleeps: twice what the
 * channel's recent replies took, within these bounds, while the daemon's
 * last reply said few channels are busy (spin_ok: else SPIN_MIN_NS, since
 * many spinning clients would take the CPUs their calls need). A reply that
 * comes while the caller sleeps costs a wake-up (futex), which on a VM's
 * idle vCPU was measured at 100-150 µs, more than most calls take: a Commit
 * of 16 rows answered in 80 µs took 250 µs with a fixed 20 µs spin, 75 µs
 * with this one.
 */
#define SPIN_MIN_NS 20000ull
#define SPIN_MAX_NS 500000ull

struct kvpc_chan {
	int sock;
	unsigned char *map;
	size_t map_len;
	uint64_t area;
	uint32_t seq;
	uint64_t took_ns; /* the recent replies' time (a moving average), 0 before the first */
	bool forked;      /* this process is a fork of the one that opened it: never used */
	struct kvpc_chan *prev, *next;
};

/*
 * Every open channel, so that a fork's child closes their sockets at once:
 * else the daemon would keep a channel whose owner closed it for as long as
 * the child lives (it ends a channel when its socket's last holder closes
 * it). The child's copies are marked, and never used.
 */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kvpc_chan *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static void
fork_prepare(void)
{
	pthread_mutex_lock(&reg_mu);
}

static void
fork_parent(void)
{
	pthread_mutex_unlock(&reg_mu);
}

static void
fork_child(void)
{
	for (struct kvpc_chan *ch = reg_head; ch != NULL; ch = ch->next) {
		if (ch->sock >= 0)
			close(ch->sock);
		ch->sock = -1;
		ch->forked = true;
	}
	pthread_mutex_unlock(&reg_mu);
}

static void
reg_init(void)
{
	(void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void
kvpc_chan_close(struct kvpc_chan *ch)
{
	if (ch == NULL)
		return;
	pthread_mutex_lock(&reg_mu);
	if (ch->prev != NULL)
		ch->prev->next = ch->next;
	else if (reg_head == ch)
		reg_head = ch->next;
	if (ch->next != NULL)
		ch->next->prev = ch->prev;
	pthread_mutex_unlock(&reg_mu);
	if (ch->map != NULL)
		munmap(ch->map, ch->map_len);
	if (ch->sock >= 0)
		close(ch->sock); /* the daemon's thread for it ends */
	free(ch);
}

int
kvpc_chan_open(const char *ipc_path, uint64_t uid, uint32_t timeout_ms, struct kvpc_chan **out)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	struct kvpc_chan *ch;
	int fd = -1;

	if (ipc_path == NULL || out == NULL ||
	    (size_t)snprintf(a.sun_path, sizeof(a.sun_path), "%s.shm", ipc_path) >=
	        sizeof(a.sun_path))
		return KVP_EINVAL;
	if ((ch = calloc(1, sizeof(*ch))) == NULL)
		return KVP_ENOMEM;
	ch->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	uint64_t area = 0;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &area, .iov_len = sizeof(area)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                   .msg_controllen = sizeof(u.buf)};
	if (ch->sock < 0 || setsockopt(ch->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(ch->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
	    connect(ch->sock, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    getsockopt(ch->sock, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
	    (uint64_t)cred.uid != uid ||
	    send(ch->sock, KVP_CHAN_HELLO, 8, MSG_NOSIGNAL) != 8 ||
	    recvmsg(ch->sock, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL) != (ssize_t)sizeof(area))
		goto fail;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	if (cm == NULL || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
	    cm->cmsg_len != CMSG_LEN(sizeof(int)))
		goto fail;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	/* A memfd of the size agreed: nothing else is mapped. */
	struct stat st;
	ch->area = area;
	ch->map_len = KVP_CHAN_HDR + 2 * area;
	if (area == 0 || area > UINT32_MAX || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size != ch->map_len)
		goto fail;
	ch->map = mmap(NULL, ch->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ch->map == MAP_FAILED) {
		ch->map = NULL;
		goto fail;
	}
	close(fd);
	fd = -1;
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)ch->map;
	if (h->magic != KVP_CHAN_MAGIC || h->area != area)
		goto fail;
	ch->seq = atomic_load(&h->req_seq);
	(void)pthread_once(&reg_once, reg_init);
	pthread_mutex_lock(&reg_mu);
	ch->next = reg_head;
	if (reg_head != NULL)
		reg_head->prev = ch;
	reg_head = ch;
	pthread_mutex_unlock(&reg_mu);
	*out = ch;
	return KVP_OK;
fail:
	if (fd >= 0)
		close(fd);
	kvpc_chan_close(ch);
	return KVP_ENOTFOUND;
}

int
kvpc_chan_call(struct kvpc_chan *ch, const uint8_t *req, size_t len, uint32_t timeout_ms,
               nng_msg **reply)
{
	if (ch == NULL || (req == NULL && len > 0) || reply == NULL)
		return KVP_EINVAL;
	if (ch->forked)
		return KVP_EINTERNAL; /* the parent's channel: this process drops it */
	if (len > ch->area)
		return KVP_EINVAL;
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)ch->map;
	uint32_t seq = ++ch->seq;
	memcpy(kvp_chan_req(ch->map), req, len);
	atomic_store(&h->req_len, (uint32_t)len);
	atomic_store(&h->req_seq, seq);
	uint64_t t0 = kvp_mono_ns();
	kvp_futex_wake(&h->req_seq);
	uint64_t spin = atomic_load(&h->spin_ok) == 1 ? 2 * ch->took_ns : SPIN_MIN_NS;
	spin = spin < SPIN_MIN_NS ? SPIN_MIN_NS : spin > SPIN_MAX_NS ? SPIN_MAX_NS : spin;
	uint32_t got = kvp_chan_spin(&h->rep_seq, seq - 1, t0, spin);
	uint64_t end = (uint64_t)nng_clock() + timeout_ms;
	while (got != seq) {
		uint64_t t = (uint64_t)nng_clock();
		if (t >= end)
			return KVP_EBUSY;
		uint32_t wait = end - t < LOOK_MS ? (uint32_t)(end - t) : LOOK_MS;
		(void)kvp_futex_wait(&h->rep_seq, got, wait);
		if ((got = atomic_load(&h->rep_seq)) == seq)
			break;
		/* The daemon's end of the socket closed (it exited): no reply will come. */
		struct pollfd p = {.fd = ch->sock, .events = POLLIN};
		if (poll(&p, 1, 0) != 0)
			return KVP_EINTERNAL;
	}
	uint64_t took = kvp_mono_ns() - t0;
	ch->took_ns = ch->took_ns == 0 ? took : (7 * ch->took_ns + took) / 8;
	uint32_t rl = atomic_load(&h->rep_len);
	if (rl == 0 || rl > ch->area)
		return KVP_EINTERNAL;
	nng_msg *msg;
	if (nng_msg_alloc(&msg, rl) != 0)
		return KVP_ENOMEM;
	memcpy(nng_msg_body(msg), kvp_chan_rep(ch->map, ch->area), rl);
	*reply = msg;
	return KVP_OK;
}
