/*
 * serve.h — list and get of cached resources answered from the LMDB store
 * (DESIGN.md "Serving rules"). Plugs into the front end's route stage: for a
 * GET list/get of a cached, synced resource asking for JSON, or for
 * protobuf (built-in kinds, from the resource's protobuf cache: DESIGN.md
 * "Encodings"), the objects or their metadata only (PartialObjectMetadata
 * [List] meta.k8s.io/v1, derived by pom.h), the decision table (decide.h)
 * says serve, wait, answer an error, or pass to the upstream.
 *
 * Lists are streamed from short read transactions, one per chunk, all at
 * the same rv (store_scan rebuilds a past state from history), so memory per
 * request is one chunk plus at most max_buffer queued on the socket (plus,
 * for a pretty or gzip-accepting answer, body.h's hold and zlib state), and
 * no transaction stays open while a client is slow. A NotOlderThan rv the cache
 * has not reached waits for the store's commits up to wait_ms.
 *
 * A protobuf list is planned before its first byte (its envelope states the
 * items' length): one read transaction at the list's rv sums what the items
 * take, reading lengths and index bytes only; the chunks then stream the
 * items, and a stream whose items would not add up to the plan is cut.
 *
 * Passed to the upstream rather than answered here (kube's answer could
 * differ from what kwc can build): HEAD, Table/YAML Accept headers and
 * metadata-only ones kwc does not derive (v1beta1, a custom resource's
 * protobuf, the List kind on a get), protobuf while the resource's protobuf cache is not serving
 * (the request starts a lazily started one: refl_want), field selectors on fields kwc does not
 * index for the encoding (the upstream converts or rejects them), selectors over kwc's parser
 * bounds, every cell of the decision table that says so, and the table's errors (400, 422, 500,
 * 504) for protobuf requests: kwc writes those Status bodies in JSON, and the upstream answers them
 * the same way in protobuf. A protobuf get's 404 is kwc's own, in protobuf (a metadata-only one's
 * is the upstream's). Every answer (200s and Status errors) is written through body.h: pretty JSON
 * when asked (?pretty, curl's User-Agent), gzip past kube's threshold. Loop thread only.
 */
#ifndef KWC_SERVE_H
#define KWC_SERVE_H

#include <stdbool.h>
#include <stddef.h>

#include "kwc/decide.h"

struct event_base;
struct store;
struct refl;
struct refl_set;
struct up_client;
struct pt_options;
struct route_req;
struct hreq;
struct serve;

struct serve_options {
    enum decide_too_large too_large;
    int wait_ms;          /* NotOlderThan wait (kube: 3000) */
    size_t max_buffer;    /* response bytes queued per client */
    struct up_client *up; /* for reads handed upstream after a wait */
    const struct pt_options *pt;
};

/* set (the caches, reflector.h) and everything in o are borrowed and must
 * outlive the serve. */
struct serve *serve_new(struct event_base *base, struct store *st, const struct refl_set *set,
                        const struct serve_options *o);
void serve_free(struct serve *s);

/* Route stage (head read): true when s took req (it answers it on
 * every path); false: not a cached read, the caller passes it through. */
bool serve_take(struct serve *s, struct hreq *req, const struct route_req *r);

/* The store committed (a refl_ingest_subscribe subscriber, s the serve):
 * wake requests waiting for an rv. */
void serve_committed(void *s);

/* Counters for tests (nothing logs them). */
struct serve_stats {
    unsigned long long lists, gets, errors, waited, passed_after_wait;
};
void serve_stats(const struct serve *s, struct serve_stats *out);

#endif
