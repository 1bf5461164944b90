/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvpoolctl vllm-events`: follows a vLLM-wire publisher (kvpoold's, or
 * vLLM's own) the way vLLM's example subscriber does, and prints each batch
 * as one JSON line {"topic", "seq", "batch"}. With a replay endpoint it
 * repairs gaps (and, with --from, catches up first) and says so on stderr.
 */
#define _POSIX_C_SOURCE 200809L

#include "clients/c/tools/vllm_watch.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/kvp_status.h"
#include "proto/vllm_wire.h"
#include "proto/vllm_zmq.h"

struct watch {
	const struct kvp_vllm_watch_options *o;
	void *replay;
	struct kvp_vllm_buf json;
	bool have_last;
	uint64_t last, printed, replayed;
};

static void
print_batch(struct watch *w, const char *topic, size_t topic_len, uint64_t seq,
            const uint8_t *payload, size_t len)
{
	if (kvp_vllm_payload_json(payload, len, &w->json) != KVP_OK) {
		fprintf(stderr, "kvpoolctl: seq %llu: payload is not msgpack (%zu bytes)\n",
		        (unsigned long long)seq, len);
		return;
	}
	printf("{\"topic\":\"");
	for (size_t i = 0; i < topic_len; i++)
		if (topic[i] == '"' || topic[i] == '\\')
			printf("\\%c", topic[i]);
		else if ((unsigned char)topic[i] >= 0x20)
			putchar(topic[i]);
	printf("\",\"seq\":%llu,\"batch\":%s}\n", (unsigned long long)seq, (const char *)w->json.data);
	fflush(stdout);
	w->printed++;
	w->last = seq;
	w->have_last = true;
}

/* Asks the replay socket for every batch from `from` on; prints those not yet seen. */
static void
replay_from(struct watch *w, uint64_t from)
{
	uint8_t seqb[8];
	kvp_vllm_seq_put(seqb, from);
	/* DEALER with REQ's empty delimiter: the reply comes in REQ's envelope. */
	if (zmq_send(w->replay, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(w->replay, seqb, 8, 0) < 0) {
		fprintf(stderr, "kvpoolctl: replay request failed: %s\n", zmq_strerror(errno));
		return;
	}
	for (;;) {
		zmq_msg_t f[4];
		int nf;
		zmq_pollitem_t it = {.socket = w->replay, .events = ZMQ_POLLIN};
		if (zmq_poll(&it, 1, w->o->timeout_ms) <= 0) {
			fprintf(stderr, "kvpoolctl: replay: no answer within %d ms\n", w->o->timeout_ms);
			return;
		}
		nf = kvp_vllm_recv_frames(w->replay, 0, f, 4);
		/* ["", [topic,] seq, payload] */
		bool done = true;
		if (nf >= 3 && zmq_msg_size(&f[nf - 2]) == 8) {
			uint64_t seq = kvp_vllm_seq_get(zmq_msg_data(&f[nf - 2]));
			done = seq == KVP_VLLM_END_SEQ || zmq_msg_size(&f[nf - 1]) == 0;
			if (!done && (!w->have_last || seq > w->last)) {
				const char *t = nf == 4 ? zmq_msg_data(&f[1]) : "";
				print_batch(w, t, nf == 4 ? zmq_msg_size(&f[1]) : 0, seq,
				            zmq_msg_data(&f[nf - 1]), zmq_msg_size(&f[nf - 1]));
				w->replayed++;
			}
		}
		for (int i = 0; i < nf; i++)
			zmq_msg_close(&f[i]);
		if (done)
			return;
	}
}

static volatile sig_atomic_t interrupted;
static void
on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

int
kvp_vllm_watch(const struct kvp_vllm_watch_options *o)
{
	struct watch w = {.o = o};
	void *ctx = zmq_ctx_new(), *sub = NULL;
	int zero = 0, rv = 1, idle_ms = 0;

	if (ctx == NULL || (sub = zmq_socket(ctx, ZMQ_SUB)) == NULL) {
		fprintf(stderr, "kvpoolctl: cannot create a ZeroMQ socket: %s\n", zmq_strerror(errno));
		goto out;
	}
	zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(sub, ZMQ_SUBSCRIBE, o->topic, strlen(o->topic));
	if ((o->bind ? zmq_bind(sub, o->url) : zmq_connect(sub, o->url)) != 0) {
		fprintf(stderr, "kvpoolctl: cannot %s %s: %s\n", o->bind ? "bind" : "connect to", o->url,
		        zmq_strerror(errno));
		goto out;
	}
	if (o->replay_url != NULL) {
		if ((w.replay = zmq_socket(ctx, ZMQ_DEALER)) == NULL ||
		    zmq_setsockopt(w.replay, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
		    zmq_connect(w.replay, o->replay_url) != 0) {
			fprintf(stderr, "kvpoolctl: cannot connect to %s: %s\n", o->replay_url,
			        zmq_strerror(errno));
			goto out;
		}
		if (o->has_from)
			replay_from(&w, o->from);
	}
	signal(SIGINT, on_sigint);
	rv = 0;
	/* Without --follow: until nothing arrives for two seconds. */
	while (!interrupted && (o->max == 0 || w.printed < o->max) && (o->follow || idle_ms < 2000)) {
		zmq_pollitem_t it = {.socket = sub, .events = ZMQ_POLLIN};
		if (zmq_poll(&it, 1, 100) <= 0) {
			idle_ms += 100;
			continue;
		}
		idle_ms = 0;
		zmq_msg_t f[3];
		int nf = kvp_vllm_recv_frames(sub, 0, f, 3);
		if (nf == 3 && zmq_msg_size(&f[1]) == 8) {
			uint64_t seq = kvp_vllm_seq_get(zmq_msg_data(&f[1]));
			if (w.have_last && seq > w.last + 1) {
				fprintf(stderr, "kvpoolctl: gap: seq %llu..%llu missed\n",
				        (unsigned long long)w.last + 1, (unsigned long long)seq - 1);
				if (w.replay)
					replay_from(&w, w.last + 1);
			} else if (w.have_last && seq <= w.last) {
				fprintf(stderr, "kvpoolctl: seq went back to %llu: the publisher restarted\n",
				        (unsigned long long)seq);
				w.have_last = false;
			}
			if (!w.have_last || seq > w.last)
				print_batch(&w, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), seq,
				            zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
		} else {
			fprintf(stderr, "kvpoolctl: a message of %d frame(s) is not vLLM's wire\n", nf);
		}
		for (int i = 0; i < nf; i++)
			zmq_msg_close(&f[i]);
	}
	if (w.printed == 0 && !interrupted)
		fprintf(stderr, "kvpoolctl: no batch from %s within 2 s (is kvpoold running with "
		                "--vllm-events there, and has a call produced events?)\n", o->url);
	if (w.replayed)
		fprintf(stderr, "kvpoolctl: %llu batch(es) came from replay\n",
		        (unsigned long long)w.replayed);
out:
	if (w.replay)
		zmq_close(w.replay);
	if (sub)
		zmq_close(sub);
	if (ctx)
		zmq_ctx_term(ctx);
	kvp_vllm_buf_fini(&w.json);
	return rv;
}
