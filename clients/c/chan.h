/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chan.h: the C client's side of the same-host call channel
 * (common/shm_chan.h, issue #63): for a daemon at ipc://PATH, the unix
 * socket PATH.shm hands over a memfd, and each call's bytes go through it
 * instead of nng. Library-internal.
 */
#ifndef KVPC_CHAN_H
#define KVPC_CHAN_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvpc_chan;

/*
 * Opens the channel beside ipc_path whose daemon runs as uid (checked with
 * SO_PEERCRED: a socket some other user put there is refused), waiting at
 * most timeout_ms. KVP_OK with *out set, or a status (no channel there:
 * the caller keeps nng).
 */
int kvpc_chan_open(const char *ipc_path, uint64_t uid, uint32_t timeout_ms,
                   struct kvpc_chan **out);

/*
 * One call: req[0..len) out, the reply into a new nng message (*reply,
 * the caller's). KVP_OK; KVP_EBUSY (no reply within timeout_ms: the
 * daemon is stalled); KVP_EINTERNAL (the daemon is gone, or it sent no
 * reply: the channel is done); KVP_EINVAL (too large for the channel: the
 * caller uses nng for this call). After anything but KVP_OK and KVP_EINVAL
 * the caller closes the channel.
 */
int kvpc_chan_call(struct kvpc_chan *ch, const uint8_t *req, size_t len, uint32_t timeout_ms,
                   nng_msg **reply);

void kvpc_chan_close(struct kvpc_chan *ch);

#endif
