/* SPDX-License-Identifier: Apache-2.0 */
#define _POSIX_C_SOURCE 200809L

#include "service/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

static FILE *log_out;
static atomic_int log_min = KVPD_INFO;
static enum kvpd_log_format log_fmt = KVPD_LOG_TEXT;
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int
kvpd_log_level_parse(const char *s)
{
	if (s == NULL)
		return -1;
	for (int i = 0; i < 4; i++)
		if (strcmp(s, level_names[i]) == 0)
			return i;
	return strcmp(s, "warning") == 0 ? KVPD_WARN : -1;
}

int
kvpd_log_format_parse(const char *s)
{
	if (s == NULL)
		return -1;
	if (strcmp(s, "text") == 0)
		return KVPD_LOG_TEXT;
	return strcmp(s, "json") == 0 ? KVPD_LOG_JSON : -1;
}

const char *
kvpd_log_level_name(enum kvpd_log_level l)
{
	return (unsigned)l < 4 ? level_names[l] : "?";
}

void
kvpd_log_setup(FILE *out, enum kvpd_log_level min, enum kvpd_log_format fmt)
{
	log_out = out;
	atomic_store(&log_min, (int)min);
	log_fmt = fmt;
}

bool
kvpd_log_enabled(enum kvpd_log_level l)
{
	return (int)l >= atomic_load(&log_min);
}

/* An appender that never overruns: past cap it only counts. */
struct out {
	char *buf;
	size_t cap, len;
};

static void
put(struct out *o, const char *s, size_t n)
{
	if (o->len < o->cap) {
		size_t room = o->cap - o->len;
		memcpy(o->buf + o->len, s, n < room ? n : room);
	}
	o->len += n;
}

static void
puts_(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0. */
static size_t
utf8_len(const unsigned char *s)
{
	if (s[0] < 0x80)
		return 1;
	size_t n = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
	if (n == 0 || (n == 2 && s[0] < 0xc2))
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

/* A JSON string body: quotes, backslashes and control bytes escaped, bad UTF-8 as '?'. */
static void
put_json(struct out *o, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	while (*p) {
		char esc[8];
		size_t n;
		if (*p == '"' || *p == '\\') {
			esc[0] = '\\';
			esc[1] = (char)*p;
			put(o, esc, 2);
			p++;
		} else if (*p < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", *p);
			put(o, esc, 6);
			p++;
		} else if ((n = utf8_len(p)) == 0) {
			put(o, "?", 1);
			p++;
		} else {
			put(o, (const char *)p, n);
			p += n;
		}
	}
}

/* A text value: bare if it is one plain word, else in quotes like JSON. */
static void
put_text_value(struct out *o, const char *s)
{
	const char *v = s ? s : "";
	bool bare = v[0] != '\0';
	for (const unsigned char *p = (const unsigned char *)v; *p && bare; p++)
		bare = *p > 0x20 && *p != '"' && *p != '=' && *p != '\\' && *p < 0x7f;
	if (bare) {
		puts_(o, v);
		return;
	}
	put(o, "\"", 1);
	put_json(o, v);
	put(o, "\"", 1);
}

/* The message in text form: control bytes would split a line, so they go. */
static void
put_text_msg(struct out *o, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		char c = *p < 0x20 ? ' ' : (char)*p;
		put(o, &c, 1);
	}
}

/*
 * Whether a field's value goes into JSON bare: true, false, or a decimal
 * integer of at most 15 digits (exact in every JSON reader, whose numbers
 * are doubles: a 64-bit session id stays a string), optionally negative.
 */
static bool
json_bare(const char *v)
{
	if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0)
		return true;
	const char *d = v[0] == '-' ? v + 1 : v;
	size_t n = strspn(d, "0123456789");
	return n > 0 && n <= 15 && d[n] == '\0' && (d[0] != '0' || n == 1);
}

size_t
kvpd_log_format_line(char *buf, size_t cap, enum kvpd_log_format fmt, uint64_t wall_ms,
                     enum kvpd_log_level l, const char *component, const char *msg,
                     const struct kvpd_log_field *fields, size_t n_fields)
{
	struct out o = {.buf = buf, .cap = cap > 0 ? cap - 1 : 0};
	char ts[40];
	struct tm tm;
	time_t secs = (time_t)(wall_ms / 1000);

	if (cap == 0)
		return 0;
	gmtime_r(&secs, &tm);
	size_t k = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(ts + k, sizeof(ts) - k, ".%03uZ", (unsigned)(wall_ms % 1000));
	if (fmt == KVPD_LOG_JSON) {
		puts_(&o, "{\"ts\":\"");
		puts_(&o, ts);
		puts_(&o, "\",\"level\":\"");
		puts_(&o, kvpd_log_level_name(l));
		puts_(&o, "\",\"component\":\"");
		put_json(&o, component);
		puts_(&o, "\",\"msg\":\"");
		put_json(&o, msg);
		put(&o, "\"", 1);
		for (size_t i = 0; i < n_fields; i++) {
			puts_(&o, ",\"");
			put_json(&o, fields[i].key);
			if (json_bare(fields[i].value)) { /* a number or a boolean, as its JSON type */
				puts_(&o, "\":");
				puts_(&o, fields[i].value);
				continue;
			}
			puts_(&o, "\":\"");
			put_json(&o, fields[i].value);
			put(&o, "\"", 1);
		}
		puts_(&o, "}\n");
	} else {
		char lvl[8];
		snprintf(lvl, sizeof(lvl), "%-5s", kvpd_log_level_name(l));
		puts_(&o, ts);
		put(&o, " ", 1);
		puts_(&o, lvl);
		put(&o, " ", 1);
		put_text_msg(&o, component);
		puts_(&o, ": ");
		put_text_msg(&o, msg);
		for (size_t i = 0; i < n_fields; i++) {
			put(&o, " ", 1);
			put_text_msg(&o, fields[i].key);
			put(&o, "=", 1);
			put_text_value(&o, fields[i].value);
		}
		put(&o, "\n", 1);
	}
	if (o.len <= o.cap) {
		buf[o.len] = '\0';
		return o.len;
	}
	/* Too long for one line: say so rather than write half a record. */
	if (fmt == KVPD_LOG_JSON) {
		struct out t = {.buf = buf, .cap = cap - 1};
		char note[96];
		snprintf(note, sizeof(note), "(a %zu-byte record, cut)", o.len);
		puts_(&t, "{\"ts\":\"");
		puts_(&t, ts);
		puts_(&t, "\",\"level\":\"");
		puts_(&t, kvpd_log_level_name(l));
		puts_(&t, "\",\"component\":\"");
		put_json(&t, component);
		puts_(&t, "\",\"msg\":\"");
		puts_(&t, note);
		puts_(&t, "\"}\n");
		if (t.len > t.cap)
			t.len = 0;
		buf[t.len] = '\0';
		return t.len;
	}
	if (o.cap >= 4)
		memcpy(buf + o.cap - 4, "...\n", 4);
	buf[o.cap] = '\0';
	return o.cap;
}

static uint64_t
wall_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

void
kvpd_log_fields(enum kvpd_log_level l, const char *component, const char *msg,
                const struct kvpd_log_field *fields, size_t n_fields)
{
	char line[16384]; /* the effective configuration, one record, fits */
	if (!kvpd_log_enabled(l))
		return;
	size_t n = kvpd_log_format_line(line, sizeof(line), log_fmt, wall_now_ms(), l, component,
	                                msg, fields, n_fields);
	FILE *f = log_out ? log_out : stderr;
	fwrite(line, 1, n, f); /* stdio locks the stream: lines never interleave */
	fflush(f);
}

void
kvpd_logf(enum kvpd_log_level l, const char *component, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	if (!kvpd_log_enabled(l))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kvpd_log_fields(l, component, msg, NULL, 0);
}

bool
kvpd_log_limit_take(struct kvpd_log_limit *lim, uint64_t now_ms, uint64_t *suppressed)
{
	bool ok;
	pthread_mutex_lock(&limit_lock);
	if (now_ms - lim->window_start_ms >= lim->window_ms || now_ms < lim->window_start_ms) {
		lim->window_start_ms = now_ms;
		lim->in_window = 0;
	}
	ok = lim->in_window < lim->per_window;
	if (ok) {
		lim->in_window++;
		*suppressed = lim->suppressed;
		lim->suppressed = 0;
	} else {
		lim->suppressed++;
	}
	pthread_mutex_unlock(&limit_lock);
	return ok;
}
