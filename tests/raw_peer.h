/* SPDX-License-Identifier: Apache-2.0 */
/*
 * raw_peer.h: a hostile SP REQ peer over tcp://127.0.0.1 for the stall and
 * starvation tests: it speaks nng's handshake itself, pipelines requests
 * and never reads. Test-only; include after daemon_util.h and kvp_test.h.
 */
#ifndef KVP_RAW_PEER_H
#define KVP_RAW_PEER_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>

/*
 * Connects to the daemon's tcp port as an SP REQ peer with a tiny receive
 * buffer, from loopback address 127.0.0.<from> (0: the kernel's choice,
 * 127.0.0.1), so one machine can play peers at several addresses.
 */
static inline int
raw_req_connect_from(const char *tcp_url, int from)
{
	int port = atoi(strrchr(tcp_url, ':') + 1), fd = -1, small = 1024;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct sockaddr_in src = {.sin_family = AF_INET};
	uint8_t hello[8] = {0x00, 'S', 'P', 0x00, 0x00, 0x30, 0x00, 0x00}, peer[8];

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	src.sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)(from - 1));
	for (int i = 0; i < 100; i++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		assert_true(fd >= 0);
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
		if (from > 0)
			assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			break;
		close(fd);
		fd = -1;
		nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
	}
	assert_true(fd >= 0);
	assert_int_equal(write(fd, hello, sizeof(hello)), (ssize_t)sizeof(hello));
	assert_int_equal(read(fd, peer, sizeof(peer)), (ssize_t)sizeof(peer));
	assert_int_equal(peer[5], 0x31); /* REP */
	return fd;
}

static inline int
raw_req_connect(const char *tcp_url)
{
	return raw_req_connect_from(tcp_url, 0);
}

/*
 * Pipelines undecodable requests (each earns an error reply) and never
 * reads, until the daemon closes the connection (*closed), or stops reading
 * it (*blocked: no byte accepted for 2 s, nng holding the pipe's one reply
 * in flight), or 20 s pass. However loaded the machine, the replies
 * eventually fill the socket and one of the two happens.
 */
static inline size_t
flood(int fd, bool *closed, bool *blocked)
{
	uint8_t frame[8 + 4 + 16];
	size_t sent = 0, off = 0;
	double until = now_s() + 20.0, last_progress = now_s();

	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	memset(frame, 0, sizeof(frame));
	frame[7] = 4 + 16; /* 64-bit big-endian length */
	memset(frame + 12, 0xff, 16);
	while (now_s() < until) {
		if (off == 0) {
			uint32_t id = 0x80000000u | (uint32_t)sent;
			for (int i = 0; i < 4; i++)
				frame[8 + i] = (uint8_t)(id >> (24 - 8 * i));
		}
		ssize_t w = send(fd, frame + off, sizeof(frame) - off, MSG_NOSIGNAL);
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
			*closed = true;
			break;
		}
		if (w < 0) {
			assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
			if (now_s() - last_progress > 2.0) {
				*blocked = true;
				break;
			}
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			(void)poll(&p, 1, 20);
			continue;
		}
		last_progress = now_s();
		off += (size_t)w;
		if (off == sizeof(frame)) {
			off = 0;
			sent++;
		}
	}
	return sent;
}

#endif /* KVP_RAW_PEER_H */
