/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.h: kvpoold's log lines, for people and for log pipelines.
 *
 * Every line has a UTC timestamp with milliseconds, a level, the component
 * that wrote it and a message, then optional key/value fields:
 *
 *   text: 2026-11-22T10:00:00.123Z info  server: ready pools=1 rpc=ipc:///x
 *   json: {"ts":"2026-11-22T10:00:00.123Z","level":"info","component":"server",
 *          "msg":"ready","pools":1,"rpc":"ipc:///x"}
 *
 * One line per record, written with one fwrite, so records from several
 * threads never interleave. Field values are given as strings; json writes
 * true, false and integers of up to 15 digits as JSON booleans and numbers
 * (longer ones, such as 64-bit ids, stay strings: JSON readers hold numbers
 * as doubles), everything else JSON-escaped; text quotes a value that holds
 * a space, '"' or '='. Nothing here ever
 * logs a token: callers pass no secrets.
 *
 * Thread-safe once kvpd_log_setup() has run (before any thread starts).
 */
#ifndef KVPD_LOG_H
#define KVPD_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kvpd_log_level { KVPD_DEBUG, KVPD_INFO, KVPD_WARN, KVPD_ERROR };
enum kvpd_log_format { KVPD_LOG_TEXT, KVPD_LOG_JSON };

/* "debug", "info", "warn" (or "warning"), "error" -> level; -1 if none. */
int kvpd_log_level_parse(const char *s);
/* "text", "json" -> format; -1 if none. */
int kvpd_log_format_parse(const char *s);
const char *kvpd_log_level_name(enum kvpd_log_level l);

/* Where lines go (stderr by default), the least level written and the form. */
void kvpd_log_setup(FILE *out, enum kvpd_log_level min, enum kvpd_log_format fmt);

bool kvpd_log_enabled(enum kvpd_log_level l);

/* One record. fields: key, value pairs (strings), n_fields pairs. */
struct kvpd_log_field {
	const char *key, *value;
};
void kvpd_log_fields(enum kvpd_log_level l, const char *component, const char *msg,
                     const struct kvpd_log_field *fields, size_t n_fields);

/* One record whose message is printf-formatted; no fields. */
void kvpd_logf(enum kvpd_log_level l, const char *component, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * Formats one record into buf (always NUL-terminated; a line that does not
 * fit is cut and ends in "...\n" or, in json, stays valid JSON by cutting
 * the message). wall_ms: milliseconds since the epoch. Returns the length.
 * No I/O: what the tests check.
 */
size_t kvpd_log_format_line(char *buf, size_t cap, enum kvpd_log_format fmt, uint64_t wall_ms,
                            enum kvpd_log_level l, const char *component, const char *msg,
                            const struct kvpd_log_field *fields, size_t n_fields);

/*
 * A rate limit for lines a peer can cause (refused authentication): at most
 * per_window lines per window_ms. kvpd_log_limit_take() returns true when a
 * line may be written, and then *suppressed is how many were dropped since
 * the last one written (to say so in that line).
 */
struct kvpd_log_limit {
	uint32_t per_window, window_ms;
	uint64_t window_start_ms, suppressed;
	uint32_t in_window;
};
bool kvpd_log_limit_take(struct kvpd_log_limit *lim, uint64_t now_ms, uint64_t *suppressed);

#endif /* KVPD_LOG_H */
