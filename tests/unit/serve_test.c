/*
 * serve_test.c — proxy/serve/serve.c: lists and gets answered from the
 * cache (include/kwc/serve.h), through kwc's HTTP server on a socketpair,
 * from a real store and reflector (cachefx.h).
 *
 * What a client sees is what is checked: the status, the head, the list as
 * JSON (kind, the list's resourceVersion, every item in key order), and
 * for a slow client that the response bytes kwc holds stay bounded while
 * the whole list still arrives intact (serve.h: one chunk plus max_buffer
 * queued). Errors: before the head, kube's Status with its code; after the
 * head (the history the list was reading is trimmed away mid-list), the
 * stream is cut — one head, no terminal chunk, the connection closed.
 * The loop runs until quiet (no byte moves, no event active); no sleeps.
 */
#include "kwc/serve.h"

#include <jansson.h>

#include "servefx.h"

#define CHUNK_BYTES (64 * 1024) /* serve.c's chunk: what one fill may add over max_buffer */

static void
get(struct cfx *f, int c, const char *target)
{
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: kwc\r\n\r\n", target);
    cfx_send(f, c, req);
}

/* Client c's bytes from off on as one response, read and parsed. */
static void
response(struct cfx *f, int c, size_t off, struct cfx_resp *r)
{
    cfx_read(f, c, 0);
    struct gostr_buf tail = {.p = f->p[c].in.p + off, .len = f->p[c].in.len - off};
    cfx_parse(&tail, r);
}

/* The list's items are p0000.. in order: n of them. */
static void
is_list(const struct cfx_resp *r, size_t n, uint64_t rv, const char *what)
{
    json_error_t je;
    json_t *j = json_loadb(r->body.p ? r->body.p : "", r->body.len, 0, &je);
    ok(j != NULL, what);
    if (!j) {
        printf("#   %s\n", je.text);
        return;
    }
    is_str(json_string_value(json_object_get(j, "kind")), "PodList", "kind PodList");
    is_str(json_string_value(json_object_get(j, "apiVersion")), "v1", "apiVersion v1");
    char want[32];
    snprintf(want, sizeof want, "%llu", (unsigned long long)rv);
    is_str(json_string_value(json_object_get(json_object_get(j, "metadata"), "resourceVersion")),
           want, "the list's resourceVersion");
    json_t *items = json_object_get(j, "items");
    is_int(json_array_size(items), n, "every item");
    size_t bad = 0;
    for (size_t i = 0; i < json_array_size(items); i++) {
        char name[32];
        snprintf(name, sizeof name, "p%04zu", i);
        const char *got = json_string_value(
            json_object_get(json_object_get(json_array_get(items, i), "metadata"), "name"));
        bad += !got || strcmp(got, name) != 0;
    }
    is_int(bad, 0, "the items in key order, each once");
    json_decref(j);
}

/* ---- a list and a get from the cache ---- */

static void
test_list(void)
{
    struct cfx f;
    cfx_open(&f, 20, 200, 1000);
    struct serve *s = serve_open(&f, 1 << 20);
    int c = cfx_connect(&f, 0);
    struct cfx_resp r = {0};

    get(&f, c, "/api/v1/namespaces/ns/pods?resourceVersion=0");
    response(&f, c, 0, &r);
    is_int(r.status, 200, "a list with rv=0: 200");
    ok(strcasestr(r.head, "\r\nContent-Type: application/json\r\n") != NULL, "JSON");
    ok(r.complete, "the response is complete");
    is_list(&r, 20, CFX_LIST_RV, "the list is JSON");

    /* an event: a newer list holds it */
    size_t off = f.p[c].in.len;
    cfx_event(&f, STORE_ADDED, "ns", "p0020", 200);
    get(&f, c, "/api/v1/pods?resourceVersion=0");
    response(&f, c, off, &r);
    is_int(r.status, 200, "a list of every namespace: 200");
    is_list(&r, 21, CFX_LIST_RV + 1, "the list after an event");

    off = f.p[c].in.len;
    get(&f, c, "/api/v1/namespaces/ns/pods/p0003?resourceVersion=0");
    response(&f, c, off, &r);
    is_int(r.status, 200, "a get with rv=0: 200");
    json_t *j = json_loadb(r.body.p ? r.body.p : "", r.body.len, 0, NULL);
    is_str(json_string_value(json_object_get(j, "kind")), "Pod", "a get carries its kind");
    is_str(json_string_value(json_object_get(json_object_get(j, "metadata"), "name")), "p0003",
           "...and is the object asked for");
    json_decref(j);

    off = f.p[c].in.len;
    get(&f, c, "/api/v1/pods");
    response(&f, c, off, &r);
    is_int(r.status, 599, "a list without rv (Most Recent) is not the cache's");

    struct serve_stats st;
    serve_stats(s, &st);
    is_int(st.lists, 2, "two lists served");
    is_int(st.gets, 1, "one get served");
    free(r.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

/* ---- a client that reads slowly ---- */

static void
test_backpressure(void)
{
    struct cfx f;
    enum { N = 1500, SIZE = 1000, MAXBUF = 32 * 1024 };
    cfx_open(&f, N, SIZE, 1000);
    struct serve *s = serve_open(&f, MAXBUF);
    int c = cfx_connect(&f, 8192);

    get(&f, c, "/api/v1/pods?resourceVersion=0");
    ok(f.last_req != NULL, "the list is still being answered while the client reads nothing");
    size_t bound = MAXBUF + CHUNK_BYTES + 2 * SIZE, most = 0;
    if (f.last_req)
        most = hresp_queued(f.last_req);
    ok(most > 0 && most <= bound,
       "with the client stopped, kwc holds at most max_buffer and a chunk");
    if (most > bound)
        printf("#   %zu queued, bound %zu\n", most, bound);
    cfx_read(&f, c, 0);
    size_t first = f.p[c].in.len;
    ok(first < (size_t)N * SIZE / 4, "...and has not sent the list past what the socket takes");

    /* read a little at a time: the list keeps coming, the queue stays bounded */
    struct cfx_resp r = {0};
    int turns = 0;
    for (; turns < 20000 && f.last_req; turns++) {
        size_t q = hresp_queued(f.last_req);
        if (q > most)
            most = q;
        cfx_read(&f, c, 4096);
        cfx_run(&f);
    }
    response(&f, c, 0, &r);
    ok(most <= bound, "the queue stayed bounded all along");
    ok(turns > 10, "the list took many reads");
    is_int(r.status, 200, "200");
    ok(r.chunked && r.complete, "a chunked stream, ended cleanly");
    is_list(&r, N, CFX_LIST_RV, "the whole list arrived intact");
    is_int(f.last_done.how, HREQ_END_DONE, "the request ended done");
    free(r.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

/* ---- the chunks: full ones, at most 64 KiB with their framing ---- */

/* A list's chunks are blocks of at most 64 KiB - 8 (with "fff8\r\n" and
 * "\r\n": four full TLS records), each filled until the next item would not
 * fit; an item larger than that is a chunk of its own. */
static void
test_chunk_sizes(void)
{
    struct cfx f;
    enum { N = 400, SIZE = 1500, BIG = 100 * 1024 };
    cfx_open(&f, N, SIZE, 1000);
    struct serve *s = serve_open(&f, 1 << 20);
    int c = cfx_connect(&f, 0);
    cfx_event(&f, STORE_MODIFIED, "ns", "p0100", BIG); /* one item larger than a chunk */
    get(&f, c, "/api/v1/pods?resourceVersion=0");
    struct cfx_resp r = {0};
    for (int turns = 0; turns < 1000 && f.last_req; turns++) {
        cfx_read(&f, c, 0);
        cfx_run(&f);
    }
    response(&f, c, 0, &r);
    ok(r.chunked && r.complete, "a chunked list, complete");
    const char *in = f.p[c].in.p, *end = in + f.p[c].in.len;
    const char *b = memmem(in, f.p[c].in.len, "\r\n\r\n", 4);
    size_t sizes[64], n = 0;
    for (b = b ? b + 4 : end; b < end && n < 64;) {
        char *e;
        size_t len = strtoul(b, &e, 16);
        if (len == 0)
            break;
        sizes[n++] = len;
        b = e + 2 + len + 2;
    }
    size_t over = 0, underfilled = 0, big = 0;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] > BIG) {
            big++;
            continue;
        }
        over += sizes[i] > 64 * 1024 - 8;
        /* a chunk ends before the item that would not fit (or before the big one) */
        underfilled += i + 1 < n && sizes[i + 1] <= BIG && sizes[i] + SIZE + 100 < 64 * 1024 - 8;
    }
    printf("# %zu chunks\n", n);
    ok(n > 5, "several chunks");
    is_int(over, 0, "no chunk over 64 KiB - 8 bytes");
    is_int(underfilled, 0, "every chunk filled until the next item would not fit");
    is_int(big, 1, "the item larger than a chunk: a chunk of its own");
    free(r.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

/* ---- errors ---- */

static void
test_error_before_head(void)
{
    struct cfx f;
    cfx_open(&f, 5, 100, 1000);
    struct serve *s = serve_open(&f, 1 << 20);
    int c = cfx_connect(&f, 0);
    struct cfx_resp r = {0};

    get(&f, c, "/api/v1/pods?resourceVersionMatch=NotOlderThan");
    response(&f, c, 0, &r);
    is_int(r.status, 422, "resourceVersionMatch without resourceVersion: 422");
    json_t *j = json_loadb(r.body.p ? r.body.p : "", r.body.len, 0, NULL);
    is_str(json_string_value(json_object_get(j, "kind")), "Status", "a Status");
    is_str(json_string_value(json_object_get(j, "reason")), "Invalid", "reason Invalid");
    is_int(json_integer_value(json_object_get(j, "code")), 422, "code 422");
    json_decref(j);

    size_t off = f.p[c].in.len;
    get(&f, c, "/api/v1/namespaces/ns/pods/nope?resourceVersion=0");
    response(&f, c, off, &r);
    is_int(r.status, 404, "a get of an object not there: 404");
    j = json_loadb(r.body.p ? r.body.p : "", r.body.len, 0, NULL);
    is_str(json_string_value(json_object_get(j, "reason")), "NotFound", "reason NotFound");
    is_str(json_string_value(json_object_get(j, "message")), "pods \"nope\" not found",
           "kube's message");
    json_decref(j);

    off = f.p[c].in.len;
    get(&f, c, "/api/v1/pods?limit=2&resourceVersion=0&labelSelector=a%20in%20(");
    response(&f, c, off, &r);
    is_int(r.status, 400, "a label selector kube cannot parse: 400");
    ok(!f.p[c].eof, "the connection stays open after a Status");
    free(r.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

static void
test_error_after_head(void)
{
    struct cfx f;
    enum { N = 1500, SIZE = 1000, MAXBUF = 32 * 1024 };
    /* a short history: the events below push its floor past the list's rv */
    cfx_open(&f, N, SIZE, 8);
    struct serve *s = serve_open(&f, MAXBUF);
    int c = cfx_connect(&f, 8192);

    get(&f, c, "/api/v1/pods?resourceVersion=0");
    cfx_read(&f, c, 0);
    struct cfx_resp r = {0};
    cfx_parse(&f.p[c].in, &r);
    is_int(r.status, 200, "the list started: its head is out");
    ok(!r.complete, "...its body is not");

    /* the state the list reads (its rv) leaves the history */
    for (int i = 0; i < 20; i++)
        cfx_event(&f, STORE_MODIFIED, "ns", "p0001", 100);
    int turns = 0;
    for (; turns < 20000 && !f.p[c].eof; turns++) {
        cfx_read(&f, c, 4096);
        cfx_run(&f);
    }
    cfx_read(&f, c, 0);
    ok(f.p[c].eof, "the stream is cut: the connection closes");
    cfx_parse(&f.p[c].in, &r);
    is_int(r.status, 200, "the head stays the one sent");
    is_int(r.heads, 1, "no second head (no Status after the 200)");
    ok(!r.complete, "no terminal chunk: the client sees the list incomplete");
    is_int(f.last_done.how, HREQ_END_CLOSED, "the request ended with its connection closed");
    is_int(f.last_done.status, 200, "...after its 200");
    free(r.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

int
main(void)
{
    TAP_RUN(test_list);
    TAP_RUN(test_backpressure);
    TAP_RUN(test_chunk_sizes);
    TAP_RUN(test_error_before_head);
    TAP_RUN(test_error_after_head);
    return tap_done();
}
