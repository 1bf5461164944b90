/* SPDX-License-Identifier: Apache-2.0 */
/* /metrics: every pool's gauges and counters in Prometheus text format. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/kvp_status.h"
#include "common/kvp_version.h"
#include "service/pool/server.h"

struct out {
	char *buf;
	size_t len, cap;
	int failed;
};

static void
put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		size_t room = o->cap - o->len;
		va_start(ap, fmt);
		int n = vsnprintf(o->buf + o->len, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->failed = 1;
			return;
		}
		if ((size_t)n < room) {
			o->len += (size_t)n;
			return;
		}
		size_t cap = o->cap * 2 + (size_t)n;
		char *nb = realloc(o->buf, cap);
		if (nb == NULL) {
			o->failed = 1;
			return;
		}
		o->buf = nb;
		o->cap = cap;
	}
}

static void
help(struct out *o, const char *name, const char *type, const char *text)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

/*
 * The standard process_* metrics (Prometheus client conventions) from
 * /proc/self: resident and virtual memory, CPU seconds, open and maximum
 * file descriptors, start time. A value /proc does not give is left out.
 */
static void
kvpd_metrics_process(struct out *o)
{
	char buf[2048];
	FILE *f = fopen("/proc/self/stat", "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);

	if (f)
		fclose(f);
	buf[n] = '\0';
	/* Fields after the command name, which may hold spaces: skip past its ')'. */
	char *p = strrchr(buf, ')');
	unsigned long long utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
	if (p != NULL && tck > 0 && page > 0 &&
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d "
	                  "%*d %*d %llu %llu %llu", &utime, &stime, &start, &vsize, &rss) == 5) {
		help(o, "process_cpu_seconds_total", "counter", "User and system CPU time spent.");
		put(o, "process_cpu_seconds_total %.2f\n", (double)(utime + stime) / (double)tck);
		help(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size.");
		put(o, "process_virtual_memory_bytes %llu\n", vsize);
		help(o, "process_resident_memory_bytes", "gauge", "Resident memory size.");
		put(o, "process_resident_memory_bytes %llu\n", rss * (unsigned long long)page);
		/* Start time: boot time (btime in /proc/stat) plus the ticks after boot. */
		FILE *st = fopen("/proc/stat", "r");
		unsigned long long btime = 0;
		bool have = false;
		while (st && fgets(buf, sizeof(buf), st))
			if (sscanf(buf, "btime %llu", &btime) == 1) {
				have = true;
				break;
			}
		if (st)
			fclose(st);
		if (have) {
			help(o, "process_start_time_seconds", "gauge",
			     "Start time of the process since the epoch, in seconds.");
			put(o, "process_start_time_seconds %.2f\n",
			    (double)btime + (double)start / (double)tck);
		}
	}
	DIR *d = opendir("/proc/self/fd");
	if (d != NULL) {
		unsigned long fds = 0;
		for (struct dirent *e; (e = readdir(d)) != NULL;)
			if (e->d_name[0] != '.')
				fds++;
		closedir(d);
		help(o, "process_open_fds", "gauge", "Open file descriptors.");
		put(o, "process_open_fds %lu\n", fds > 0 ? fds - 1 : 0); /* not opendir's own */
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		help(o, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
		put(o, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
	}
}

#define GAUGE(name, text, expr)                                                          \
	do {                                                                             \
		help(o, "kvpool_" name, "gauge", text);                                 \
		for (size_t i = 0; i < np; i++)                                          \
			put(o, "kvpool_" name "{pool=\"%s\"} %.17g\n",                  \
			    kvpd_server_pool_name(s, i), (double)(expr));                \
	} while (0)
/* A gauge per pool, for the pools where `when` holds. */
#define GAUGE_WHERE(name, text, when, expr)                                              \
	do {                                                                             \
		help(o, "kvpool_" name, "gauge", text);                                 \
		for (size_t i = 0; i < np; i++)                                          \
			if (when)                                                        \
				put(o, "kvpool_" name "{pool=\"%s\"} %.17g\n",         \
				    kvpd_server_pool_name(s, i), (double)(expr));        \
	} while (0)
/* A counter per pool, for the pools where `when` holds. */
#define COUNTER_WHERE(name, text, when, expr)                                            \
	do {                                                                             \
		help(o, "kvpool_" name, "counter", text);                               \
		for (size_t i = 0; i < np; i++)                                          \
			if (when)                                                        \
				put(o, "kvpool_" name "{pool=\"%s\"} %llu\n",           \
				    kvpd_server_pool_name(s, i),                         \
				    (unsigned long long)(expr));                         \
	} while (0)
#define COUNTER(name, text, expr) COUNTER_WHERE(name, text, 1, expr)

/* Each pool's gauges and counters. */
static void
render_pools(struct out *o, struct kvpd_server *s, size_t np, const struct kvpd_pool_gauges *g,
             const struct kvpd_pool_counters *c)
{
	GAUGE("blocks", "Blocks in the pool, the null block included.", g[i].num_blocks);
	GAUGE("blocks_free", "Free blocks, evictable cached blocks included.", g[i].num_free);
	GAUGE("blocks_cached", "Blocks holding a cached hash.", g[i].num_cached_blocks);
	GAUGE("blocks_in_use", "Blocks with a reference (not the null block).",
	      g[i].num_blocks - 1 - g[i].num_free);
	GAUGE("cached_keys", "Distinct (hash, group) keys in the prefix cache.", g[i].num_cached_keys);
	GAUGE("usage_ratio", "1 - free / (blocks - 1).", g[i].usage);
	GAUGE("sessions", "Open sessions.", c[i].sessions);
	GAUGE("requests_active", "Requests held by the request-level manager.", g[i].active_requests);
	COUNTER("prefix_cache_requests_total", "Prefix-cache lookups of requests.", g[i].prefix_requests);
	COUNTER("prefix_cache_queries_tokens_total", "Prompt tokens looked up.", g[i].prefix_queries);
	COUNTER("prefix_cache_hits_tokens_total", "Prompt tokens found cached.", g[i].prefix_hits);
	COUNTER("blocks_allocated_total", "Blocks handed out.", g[i].blocks_allocated);
	COUNTER("allocation_failures_total", "Allocations refused for lack of free blocks.",
	        g[i].alloc_failures);
	COUNTER("blocks_evicted_total", "Cached hashes dropped (each a BlockRemoved).",
	        g[i].blocks_evicted);
	COUNTER("blocks_stored_total", "Blocks cached (BlockStored hashes).", g[i].blocks_stored);
	COUNTER("resets_total", "Successful prefix-cache resets.", g[i].resets);
	COUNTER("events_emitted_total", "KV cache events emitted by the pool.", c[i].events_emitted);
	COUNTER("events_published_total", "Event batches published on the stream.",
	        c[i].event_batches);
	COUNTER("replays_served_total", "Replay requests answered with their batches.",
	        c[i].replays_served);
	COUNTER("replays_refused_total", "Replay requests whose batches were gone (or epoch stale).",
	        c[i].replays_refused);
	COUNTER("snapshots_total", "Snapshot requests served.", c[i].snapshots);
	GAUGE("replay_ring_bytes", "Bytes of event batches the replay ring holds (replay-mib bounds it).",
	      c[i].replay_bytes);
	COUNTER("replay_batches_dropped_for_bytes_total",
	        "Event batches the replay ring dropped early to stay within replay-mib.",
	        c[i].replay_dropped_for_bytes);
	COUNTER("block_bytes_read_total", "Bytes of block contents read (ReadBlocks).",
	        c[i].bytes_read);
	COUNTER("block_bytes_written_total",
	        "Bytes of block contents written (WriteBlocks, WriteTokens).", c[i].bytes_written);
	GAUGE("reply_cache_bytes", "Bytes of stored replies kept for retried calls "
	      "(reply-cache-mib bounds it).", c[i].reply_cache_bytes);
	COUNTER("replies_forgotten_total", "Stored replies dropped early to stay within "
	        "reply-cache-mib (a retry of one is applied again).", c[i].replies_forgotten);
	GAUGE("session_refs", "Block references the pool's sessions hold (max-refs bounds it).",
	      c[i].refs_held);
	COUNTER("limit_refusals_total", "Calls refused BUSY at max-refs or max-session-requests.",
	        c[i].limit_refusals);
	COUNTER("quota_refusals_total", "Calls refused QUOTA_EXCEEDED: a session at its quota "
	        "(the pool's session_refs or session_rows).", c[i].quota_refusals);
	COUNTER("cluster_pending_total", "Region lookups of a missed key answered pending while "
	        "the cluster tier's agent fills it (docs/cluster.md).", c[i].cluster_pending);
	COUNTER("cluster_dropped_total", "Missed keys the cluster-fill table had no room for "
	        "(answered a miss; the pool's cluster_wants).", c[i].cluster_dropped);
	GAUGE_WHERE("warm_rows_kept", "restart=warm: rows this life's start found committed and "
	            "whole, and serves again (docs/operations.md).", c[i].warm, c[i].warm_kept);
	GAUGE_WHERE("warm_rows_dropped", "restart=warm: records this life's start refused (a "
	            "torn record, a row whose bytes changed, or a commit not yet proven).",
	            c[i].warm, c[i].warm_dropped);
	GAUGE_WHERE("warm_rows_unproven", "restart=warm: rows committed without a CRC32C that "
	            "the reaper has yet to read (a kill now would drop them).", c[i].warm,
	            c[i].warm_unproven);
	COUNTER_WHERE("warm_rows_proven_total", "restart=warm: rows committed without a CRC32C "
	              "whose CRC32C the reaper took, this life.", c[i].warm, c[i].warm_proven);
	GAUGE_WHERE("disk_rows", "Disk tier: its slots, one row each (the pool's disk_rows).",
	            c[i].disk, c[i].disk_slots);
	GAUGE_WHERE("disk_rows_used", "Disk tier: slots holding a committed row.", c[i].disk,
	            c[i].disk_used);
	COUNTER_WHERE("disk_writes_total", "Disk tier: committed rows written behind.", c[i].disk,
	              c[i].disk_writes);
	COUNTER_WHERE("disk_write_skips_total", "Disk tier: committed rows not written (evicted "
	              "before their write finished, or more waiting than the region's rows).",
	              c[i].disk, c[i].disk_write_skips);
	COUNTER_WHERE("disk_fills_total", "Disk tier: rows read back into the region for a "
	              "lookup that missed them.", c[i].disk, c[i].disk_fills);
	COUNTER_WHERE("disk_fill_failures_total", "Disk tier: reads refused (an I/O error, or "
	              "bytes that fail their CRC32C): the lookup misses.", c[i].disk,
	              c[i].disk_fill_failures);
	COUNTER_WHERE("disk_io_errors_total", "Disk tier: reads and writes the file refused.",
	              c[i].disk, c[i].disk_io_errors);
	COUNTER("sessions_opened_total", "Sessions opened by Hello.", c[i].sessions_opened);
	COUNTER("leases_expired_total", "Sessions ended because their lease ran out.",
	        c[i].leases_expired);
}

/* The vLLM-wire publisher's counters, for the pools that have one. */
static void
render_vllm(struct out *o, struct kvpd_server *s, size_t np, const struct kvpd_pool_gauges *g,
            const struct kvpd_pool_counters *c)
{
	bool any_vllm = false;
	for (size_t i = 0; i < np; i++)
		any_vllm |= c[i].vllm_on;
	if (any_vllm) {
		COUNTER_WHERE("vllm_batches_published_total", "Batches published on vLLM's ZMQ event "
		              "wire.", c[i].vllm_on, c[i].vllm_batches);
		COUNTER_WHERE("vllm_bytes_published_total", "msgpack payload bytes published on the "
		              "vLLM wire.", c[i].vllm_on, c[i].vllm_bytes);
		COUNTER_WHERE("vllm_replays_served_total", "vLLM-wire replay requests answered.",
		              c[i].vllm_on, c[i].vllm_replays);
		COUNTER_WHERE("vllm_replay_requests_bad_total",
		              "vLLM-wire replay requests not in vLLM's form (not answered).",
		              c[i].vllm_on, c[i].vllm_bad_replay_requests);
		COUNTER_WHERE("vllm_replays_cut_total",
		              "vLLM-wire replays cut off: the peer took nothing for 30 s, went "
		              "away, or 64 replays were in progress.",
		              c[i].vllm_on, c[i].vllm_replays_cut);
		COUNTER_WHERE("vllm_publisher_resets_total",
		              "vLLM-wire publisher opened again because subscribers held "
		              "vllm-queue-mib of batches unread.",
		              c[i].vllm_on, c[i].vllm_publisher_resets);
		COUNTER_WHERE("vllm_send_failures_total",
		              "vLLM-wire batches not sent or not encoded (their seq is skipped).",
		              c[i].vllm_on, c[i].vllm_send_failures);
	}
}

/* Build information, then RPC calls and their latency, by call. */
static void
render_rpc(struct out *o, struct kvpd_server *s, size_t np, const struct kvpd_pool_gauges *g,
           const struct kvpd_pool_counters *c)
{
	help(o, "kvpool_build_info", "gauge", "The daemon's version and commit; always 1.");
	put(o, "kvpool_build_info{version=\"%s\",commit=\"%s\"} 1\n", KVP_VERSION, KVP_GIT_COMMIT);
	help(o, "kvpool_connections_closed_total", "counter",
	     "RPC connections the daemon closed, by reason (idle: no request for idle-timeout-ms; "
	     "took_no_reply: replies not taken (send-timeout-ms, or holding half the contexts); "
	     "tls_handshake: a TLS handshake failed; address_bound, unauthenticated_bound: an "
	     "unauthenticated address, or all of them, held their share of the contexts).");
	for (int r = 0; r < KVPD_CLOSE_REASONS; r++)
		put(o, "kvpool_connections_closed_total{reason=\"%s\"} %llu\n",
		    kvpd_close_reason_name((enum kvpd_close_reason)r),
		    (unsigned long long)kvpd_server_closes(s, (enum kvpd_close_reason)r));
	uint64_t shm_open, shm_calls;
	kvpd_server_shm(s, &shm_open, &shm_calls);
	help(o, "kvpool_shm_channels", "gauge",
	     "Same-host call channels open (ipc clients calling through shared memory).");
	put(o, "kvpool_shm_channels %llu\n", (unsigned long long)shm_open);
	help(o, "kvpool_shm_calls_total", "counter", "RPC calls served over same-host channels.");
	put(o, "kvpool_shm_calls_total %llu\n", (unsigned long long)shm_calls);
	help(o, "kvpool_rpc_calls_total", "counter", "RPC calls by call and status.");
	for (size_t i = 0; i < np; i++)
		for (int call = 0; call < KVPD_NUM_CALLS; call++)
			for (int st = 0; st < KVPD_NUM_STATUS; st++)
				if (c[i].by_call[call][st] > 0 && kvpd_call_name(call))
					put(o, "kvpool_rpc_calls_total{pool=\"%s\",call=\"%s\",status=\"%s\"} %llu\n",
					    kvpd_server_pool_name(s, i), kvpd_call_name(call),
					    kvp_status_wire_name(st), (unsigned long long)c[i].by_call[call][st]);
	help(o, "kvpool_rpc_latency_seconds", "histogram",
	     "Time to handle an RPC by call, lock wait included, network excluded.");
	for (size_t i = 0; i < np; i++) {
		const char *pool = kvpd_server_pool_name(s, i);
		for (int call = 0; call < KVPD_NUM_CALLS; call++) {
			const uint64_t *lat = c[i].latency[call];
			uint64_t cum = 0, total = 0;
			for (int b = 0; b < KVPD_LATENCY_BUCKETS; b++)
				total += lat[b];
			if (total == 0 || kvpd_call_name(call) == NULL)
				continue;
			const char *name = kvpd_call_name(call);
			for (int b = 0; b < KVPD_LATENCY_BUCKETS; b++) {
				char le[32];
				cum += lat[b];
				if (b < KVPD_LATENCY_BUCKETS - 1)
					snprintf(le, sizeof(le), "%g", kvpd_latency_bounds[b]);
				else
					snprintf(le, sizeof(le), "+Inf");
				put(o, "kvpool_rpc_latency_seconds_bucket{pool=\"%s\",call=\"%s\",le=\"%s\"} "
				        "%llu\n", pool, name, le, (unsigned long long)cum);
			}
			put(o, "kvpool_rpc_latency_seconds_sum{pool=\"%s\",call=\"%s\"} %.9f\n", pool,
			    name, c[i].latency_sum[call]);
			put(o, "kvpool_rpc_latency_seconds_count{pool=\"%s\",call=\"%s\"} %llu\n", pool,
			    name, (unsigned long long)cum);
		}
	}
	help(o, "kvpool_pool_lock_held_seconds_total", "counter",
	     "Time calls held the pool's lock to run (a pool runs one call at a time: a rate "
	     "near 1 means the pool is saturated).");
	for (size_t i = 0; i < np; i++)
		put(o, "kvpool_pool_lock_held_seconds_total{pool=\"%s\"} %.9f\n",
		    kvpd_server_pool_name(s, i), c[i].lock_held_s);
	help(o, "kvpool_pool_lock_wait_seconds_total", "counter",
	     "Time calls waited for the pool's lock (behind other calls of the same pool).");
	for (size_t i = 0; i < np; i++)
		put(o, "kvpool_pool_lock_wait_seconds_total{pool=\"%s\"} %.9f\n",
		    kvpd_server_pool_name(s, i), c[i].lock_wait_s);
}

char *
kvpd_metrics_render(struct kvpd_server *s)
{
	size_t np = kvpd_server_num_pools(s);
	struct out o = {.buf = malloc(16384), .cap = 16384};
	struct kvpd_pool_gauges *g = calloc(np ? np : 1, sizeof(*g));
	struct kvpd_pool_counters *c = calloc(np ? np : 1, sizeof(*c));

	if (o.buf == NULL || g == NULL || c == NULL) {
		free(o.buf);
		free(g);
		free(c);
		return NULL;
	}
	for (size_t i = 0; i < np; i++) {
		kvpd_server_pool_gauges(s, i, &g[i]);
		kvpd_server_pool_counters(s, i, &c[i]);
	}
	render_pools(&o, s, np, g, c);
	render_vllm(&o, s, np, g, c);
	render_rpc(&o, s, np, g, c);
	kvpd_metrics_process(&o);
	free(g);
	free(c);
	if (o.failed) {
		free(o.buf);
		return NULL;
	}
	return o.buf;
}

#undef GAUGE
#undef COUNTER
#undef COUNTER_WHERE
