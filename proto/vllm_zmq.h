/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vllm_zmq.h: the libzmq side that both ends of vLLM's event wire share
 * (service/streams/vllm_pub.c's replay server, clients/c/tools/vllm_watch.c's follower).
 * A header of static functions: its two users link libzmq, the wire
 * library (vllm_wire.h, no I/O) does not.
 */
#ifndef KVP_VLLM_ZMQ_H
#define KVP_VLLM_ZMQ_H

#include <zmq.h>

/*
 * Receives one whole multipart message (flags: 0 or ZMQ_DONTWAIT for each
 * frame): its first cap frames into f, which the caller closes; the rest
 * are dropped. Returns how many frames were kept (0 if none could be read).
 */
static inline int
kvp_vllm_recv_frames(void *sock, int flags, zmq_msg_t *f, int cap)
{
	int nf = 0, more = 1;
	while (more) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, sock, flags) < 0) {
			zmq_msg_close(&m);
			break;
		}
		more = zmq_msg_more(&m);
		if (nf < cap)
			f[nf++] = m;
		else
			zmq_msg_close(&m);
	}
	return nf;
}

#endif
