/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chan.h: kvpoold's side of the same-host call channel (common/shm_chan.h,
 * issue #63). Beside an ipc:// endpoint PATH, a unix socket PATH.shm
 * (the endpoint's mode) hands each client that asks a memfd with a request
 * and a reply area, and a thread of its own serves that channel's calls
 * through kvpd_server_handle_to, as the nng transport does; the thread
 * ends when the client closes its socket. At most max channels at once
 * (a client past that keeps nng ipc). Threads: the acceptor and one per
 * channel.
 */
#ifndef KVPD_CHAN_H
#define KVPD_CHAN_H

#include <stddef.h>
#include <stdint.h>

struct kvpd_server;
struct kvpd_chans;

/*
 * Listens on ipc_path + ".shm" for up to max channels whose areas hold
 * area bytes each (a request or reply of up to --max-msg-bytes and the
 * slack the transport allows). KVP_OK with *out set; else a status with
 * err (the path too long for a unix socket, a file there that is not a
 * socket, no thread).
 */
int kvpd_chans_open(struct kvpd_server *srv, const char *ipc_path, uint32_t mode, uint32_t max,
                    size_t area, struct kvpd_chans **out, char *err, size_t err_len);

/* Channels open now, and calls served over them so far. */
uint32_t kvpd_chans_open_count(const struct kvpd_chans *cs);
uint64_t kvpd_chans_served(const struct kvpd_chans *cs);

/* Stops accepting, ends every channel (each within its wait, 100 ms) and frees. NULL: nothing. */
void kvpd_chans_close(struct kvpd_chans *cs);

#endif
