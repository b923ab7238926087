/*
 * access.h — one record per request, completed where the request ends, for
 * the request metrics and the access log (DESIGN.md "Operations").
 *
 * The front end starts a record when a request's head has been read
 * (access_begin, attached to the request with hreq_set_note), fills in what
 * its stages learn (the route: verb, group, resource; the caller once
 * authenticated; which handler took it: access_set_source), and the HTTP
 * server's done callback (http.h, struct hreq_done: status, bytes, times)
 * finishes it with access_finish. A watch stream served from the cache
 * leaves the HTTP server as a response stream: its record travels with it
 * (hstream_handoff_note -> access_stream) and is finished where the stream ends,
 * on its worker thread (access_stream_end): one line per stream, at its end,
 * its duration the stream's.
 *
 * What a finished request counts (metrics.h, stored families):
 *   kwc_requests_total{verb,group,resource,code,source}
 *   kwc_request_duration_seconds{verb,group,resource,source} (kube's
 *     buckets; WATCH and CONNECT: the time to the response head, as kube
 *     measures long-running requests; others: to the end of the response)
 *   kwc_response_bytes_total{verb,group,resource,source}
 * and kwc_requests_in_flight{source} while it runs. source: "cache" (serve,
 * watch), "upstream" (passthrough, tunnels), "kwc" (its own endpoints and the
 * errors its stages answer: 400/401/403/405/414/431/500).
 *
 * The access log (--access-log at info, or any request at --log-level
 * debug): log_fields "request" with method, path (the target with its
 * query; the value of every query parameter whose name contains "token",
 * "password" or "secret" is REDACTED; headers never), proto (hreq_proto:
 * HTTP/1.0, HTTP/1.1 or HTTP/2.0, as kube's httplog), user (the
 * authenticated caller, "-" before authentication or with --auth none),
 * code, bytes, duration_ms, source.
 *
 * Threads: access_begin / access_set_* / access_finish on the server's loop;
 * access_stream_end on any thread (the registry's mutex, atomic gauges).
 */
#ifndef KWC_ACCESS_H
#define KWC_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/log.h"

struct hreq;
struct hreq_done;
struct metrics;
struct route_req;

enum access_source { ACCESS_KWC, ACCESS_CACHE, ACCESS_UPSTREAM, ACCESS_NSOURCES };

struct access_options {
    bool log;             /* write the access log */
    enum log_level level; /* at this level (info with --access-log, else debug) */
};

struct access;
struct access_rec;

/* m borrowed, must outlive a. */
struct access *access_new(struct metrics *m, const struct access_options *o);
void access_free(struct access *a);

/* A record for a request whose head was just read (new; finished by
 * access_finish or access_stream_end). Source until told otherwise: kwc. */
struct access_rec *access_begin(struct access *a);
/* What the request addresses (the parse stage). method: the HTTP method;
 * route NULL when the target did not parse; upgrade: an HTTP Upgrade. */
void access_set_route(struct access_rec *r, const char *method, const struct route_req *route,
                      bool upgrade);
/* The authenticated caller (copied; only kept when the log is on). */
void access_set_user(struct access_rec *r, const char *user);
/* The handler that answers req (through its note; no-op without one). */
void access_set_source(struct hreq *req, enum access_source s);
/* The request left the HTTP server: count it, log it, free r (NULL: no-op). */
void access_finish(struct access_rec *r, const struct hreq_done *d);

/*
 * A watch stream's record (note: hstream_handoff_note; req: the request
 * just handed off with hresp_handoff, whose head is readable until the
 * loop callback returns). The response head is being sent now, with status.
 * Returns the record the stream keeps (NULL when note is NULL).
 */
struct access_rec *access_stream(void *note, struct hreq *req, int status);
/* The stream ended (any thread): bytes sent over its life, head included.
 * Frees r (NULL: no-op). */
void access_stream_end(struct access_rec *r, uint64_t bytes);

/* In flight now, by source (a gauge). */
uint64_t access_in_flight(const struct access *a, enum access_source s);
const char *access_source_name(enum access_source s);

/* ---- pure helpers (unit-tested) ---- */

/* The target with the value of every query parameter whose name (percent-
 * decoded, any case) contains "token", "password" or "secret" replaced by
 * REDACTED. New string. */
char *access_redact_target(const char *target);
/* The metric verb kube-apiserver reports (its cleanVerb): GET, LIST, WATCH
 * for reads (HEAD as GET), the HTTP method for writes (POST PUT PATCH
 * DELETE, a collection's DELETE too) and for non-resource requests, CONNECT
 * for upgrades and the exec/attach/portforward/proxy subresources; unknown
 * methods: "other". */
const char *access_metric_verb(const char *method, const struct route_req *route, bool upgrade);
/* A label value for an API group or resource from a request: itself when
 * it is a DNS-style name ([a-z0-9.-], at most 253 bytes), else "_other"
 * (bounds what a client can put in a label). NULL: "". */
const char *access_label_name(const char *s);

#endif
