/*
 * passthrough_test.c — proxy/serve/passthrough.c: the budget of response bytes
 * queued to passthrough clients (pt_budget_should_pause), by its contract in
 * passthrough.h, and the bound it gives when many clients never read.
 *
 * Then the passthrough itself, end to end on loopback (upfake.h: kwc's HTTP
 * server on a socketpair, kwc's up_client, a fake upstream API server):
 * streaming a large chunked answer with backpressure (kwc's queue to a client
 * that does not read stays within max_response_buffer and one upstream read,
 * the upstream is held back, and the client gets every byte once it reads),
 * the header policy (what the upstream receives: kwc's token, the identity
 * the stages decided, no caller credentials or hop-by-hop headers), and
 * upstream failures (nothing listening: a 503 Status; an answer cut
 * mid-body: the client's stream is cut, never followed by a second head).
 */
#include "kwc/passthrough.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "upfake.h"

#include <signal.h>

static void
test_decision(void)
{
    /* under half the budget nobody pauses, however much one holds */
    ok(!pt_budget_should_pause(100, 100, 50, 1, 2000), "under half the budget: go on");
    ok(!pt_budget_should_pause(950, 900, 50, 2, 2000), "exactly at half: go on");
    /* past it, a holder past an even share of the half pauses ... */
    ok(pt_budget_should_pause(1000, 300, 50, 4, 2000), "over: a holder past max/2/holders pauses");
    /* ... one under its share does not */
    ok(!pt_budget_should_pause(1000, 100, 50, 4, 2000), "over: a small holder goes on");
    ok(!pt_budget_should_pause(1000, 200, 50, 4, 2000), "over: up to its share");
    ok(pt_budget_should_pause(1000, 201, 50, 4, 2000), "over: one byte past its share");
    /* nothing queued: no drain would resume it, so it never pauses */
    ok(!pt_budget_should_pause(5000, 0, 65536, 10, 2000), "holding nothing: go on");
    /* one holder alone takes half the budget, not more */
    ok(!pt_budget_should_pause(900, 900, 100, 1, 2000), "alone: up to half");
    ok(pt_budget_should_pause(900, 900, 101, 1, 2000), "alone: past it");
}

/*
 * 300 clients that never read and one that does, against a budget smaller
 * than their per-client buffers added up: the upstream keeps offering reads
 * of 64 KiB to every transfer that is not paused. They arrive a few per
 * round, so the first ones fill their whole buffers before the budget is
 * reached (the case that decides the bound).
 */
#define NCLIENTS 300
#define READ_SZ 65536
#define PER_CLIENT (1u << 20)

static void
test_flood(void)
{
    const size_t max = 32u << 20;
    size_t held[NCLIENTS + 1];
    bool paused[NCLIENTS + 1];
    memset(held, 0, sizeof(held));
    memset(paused, 0, sizeof(paused));
    size_t total = 0, holders = 0, reader_got = 0;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i <= NCLIENTS; i++) {
            bool reader = i == NCLIENTS;
            if (!reader && i > 3 * round)
                continue; /* not arrived yet */
            if (reader) { /* it reads everything it was sent */
                total -= held[i];
                holders -= held[i] > 0;
                held[i] = 0;
                paused[i] = false; /* its queue drained: on_drain resumes it */
            }
            if (paused[i] || held[i] > PER_CLIENT)
                continue;
            if (pt_budget_should_pause(total, held[i], READ_SZ, holders, max)) {
                paused[i] = true;
                continue;
            }
            holders += held[i] == 0;
            held[i] += READ_SZ;
            total += READ_SZ;
            reader_got += reader ? READ_SZ : 0;
        }
        ok(total <= max + (size_t)(NCLIENTS + 1) * READ_SZ,
           "the total stays within the budget and one read per client");
    }
    size_t sum = 0;
    unsigned npaused = 0;
    for (int i = 0; i < NCLIENTS; i++) {
        sum += held[i];
        npaused += paused[i];
    }
    is_int(sum + held[NCLIENTS], total, "bookkeeping");
    ok(total <= max + (size_t)(NCLIENTS + 1) * READ_SZ, "in the end too");
    ok(total < (size_t)NCLIENTS * PER_CLIENT / 4, "far below what the per-client buffers allow");
    ok(npaused > NCLIENTS / 2, "most non-readers are paused");
    is_int(reader_got, 200 * READ_SZ, "the client that reads got a read every round");
}

/* ---- end to end ---- */

#define MAX_RESP (1u << 20)
/* one upstream read past max_response_buffer (curl's 64 KiB buffer) and its
 * chunk framing: passthrough.h's bound */
#define ONE_READ (64u * 1024 + 64)

struct pt_case {
    struct pt_options o;
    struct http_header ids[2]; /* the identity the front's stages decided */
    size_t nids;
};

static void
pt_handler(struct uf *f, struct hreq *r)
{
    struct pt_case *c = f->harg;
    if (c->nids)
        hreq_set_upstream_headers(r, c->ids, c->nids);
    pt_forward(r, f->uc, &c->o);
}

static void
case_init(struct pt_case *c, bool strip)
{
    *c = (struct pt_case){
        .o = {.max_request_buffer = 1u << 20,
              .max_response_buffer = MAX_RESP,
              .strip_credentials = strip,
              .budget = pt_budget_new(256u << 20)},
    };
}

static bool
answered(struct uf *f)
{
    return f->resp.complete || f->resp.bad || f->ceof;
}

static bool
queue_full(struct uf *f)
{
    return f->req && hresp_queued(f->req) > MAX_RESP;
}

static int
upstream_fd_outq(struct uf *f)
{
    int q = 0;
    if (f->up.bev)
        ioctl(bufferevent_getfd(f->up.bev), SIOCOUTQ, &q);
    return q;
}

static void
test_streaming(void)
{
    struct pt_case c;
    case_init(&c, true);
    struct uf f;
    uf_init(&f, UF_BIG_CHUNKED, pt_handler, &c);
    const size_t total = 64u << 20; /* more than every socket buffer on the way */
    f.up.big_total = total;
    uf_client_reading(&f, false);
    uf_send(&f, "GET /api/v1/pods HTTP/1.1\r\nHost: kwc\r\n\r\n");
    ok(uf_run_until(&f, queue_full, "kwc's queue to the client fills"),
       "a client that does not read: kwc's queue fills");

    /* Run until nothing moves any more: kwc paused the transfer, the
     * upstream's socket is full. Every turn checks the bound. */
    size_t max_queued = 0;
    int quiet = 0;
    for (long i = 0; i < 2000000 && quiet < 500 && f.req; i++) {
        uint64_t w = f.up.written;
        size_t q = hresp_queued(f.req);
        int oq = upstream_fd_outq(&f);
        event_base_loop(f.base, EVLOOP_NONBLOCK);
        size_t q2 = hresp_queued(f.req);
        if (q2 > max_queued)
            max_queued = q2;
        quiet = w == f.up.written && q == q2 && oq == upstream_fd_outq(&f) ? quiet + 1 : 0;
    }
    ok(max_queued <= MAX_RESP + ONE_READ,
       "kwc's queue stays within max_response_buffer and one read");
    if (max_queued > MAX_RESP + ONE_READ)
        printf("#   queued %zu\n", max_queued);
    ok(f.up.big_sent < total, "the upstream is held back");
    struct pt_budget_stats bs;
    pt_budget_stats(c.o.budget, &bs);
    ok(bs.queued <= MAX_RESP + ONE_READ && bs.queued > 0, "the budget counts the queue");

    uf_client_reading(&f, true);
    ok(uf_run_until(&f, answered, "the whole answer"), "the client reads: the answer completes");
    is_int(f.resp.status, 200, "200");
    is_int(f.resp.heads, 1, "one head");
    ok(f.resp.complete && !f.resp.bad, "a complete message");
    ok(uf_resp_has(&f.resp, "Transfer-Encoding: chunked"), "streamed chunked to the client");
    is_int(f.resp.body.len, total, "every byte");
    size_t bad_at = total;
    for (size_t i = 0; i < f.resp.body.len && bad_at == total; i++)
        if ((unsigned char)f.resp.body.p[i] != uf_pat(i))
            bad_at = i;
    is_int(bad_at, total, "in order, intact (first wrong byte)");
    ok(f.up.big_done, "the upstream sent its last chunk");
    uf_fini(&f);
    pt_budget_free(c.o.budget); /* asserts every byte was given back */
}

static const char strip_request[] = "GET /api/v1/namespaces/default/pods?limit=5 HTTP/1.1\r\n"
                                    "Host: kwc.example\r\n"
                                    "Authorization: Bearer client-token\r\n"
                                    "Impersonate-User: mallory\r\n"
                                    "Impersonate-Group: system:masters\r\n"
                                    "Impersonate-Extra-Scopes: all\r\n"
                                    "X-Remote-User: mallory\r\n"
                                    "Proxy-Authorization: Basic eDp5\r\n"
                                    "Connection: keep-alive, X-Drop\r\n"
                                    "X-Drop: 1\r\n"
                                    "Te: trailers\r\n"
                                    "Keep-Alive: timeout=9\r\n"
                                    "X-Keep: 2\r\n"
                                    "X-Forwarded-For: 198.51.100.1\r\n"
                                    "Accept: application/json\r\n"
                                    "\r\n";

static void
test_stripping(void)
{
    struct pt_case c;
    case_init(&c, true);
    c.ids[0] = (struct http_header){"Impersonate-User", "alice"};
    c.ids[1] = (struct http_header){"Impersonate-Group", "system:authenticated"};
    c.nids = 2;
    struct uf f;
    uf_init(&f, UF_SMALL, pt_handler, &c);
    uf_send(&f, strip_request);
    ok(uf_run_until(&f, answered, "an answer"), "answered");
    is_int(f.resp.status, 200, "the upstream's 200");
    is_mem(f.resp.body.p, f.resp.body.len, "{}", 2, "its body");
    ok(uf_resp_has(&f.resp, "X-Up: 1"), "its end-to-end header relayed");
    ok(!uf_resp_has(&f.resp, "Keep-Alive: timeout=5"), "its hop-by-hop header not");

    ok(f.up.got_head, "the upstream got the request");
    ok(strncmp(f.up.head.p, "GET /api/v1/namespaces/default/pods?limit=5 HTTP/1.1\r\n", 54) == 0,
       "method, path and query as sent");
    ok(uf_up_has(&f, "Authorization: Bearer " UF_TOKEN), "kwc's token");
    is_int(uf_up_count(&f, "Authorization"), 1, "and no other Authorization");
    ok(uf_up_has(&f, "Impersonate-User: alice"), "the identity the stages decided");
    ok(uf_up_has(&f, "Impersonate-Group: system:authenticated"), "its group");
    is_int(uf_up_count(&f, "Impersonate-User"), 1, "not the caller's Impersonate-User");
    is_int(uf_up_count(&f, "Impersonate-Group"), 1, "nor its Impersonate-Group");
    is_int(uf_up_count(&f, "Impersonate-Extra-Scopes"), 0, "nor its Impersonate-Extra-*");
    is_int(uf_up_count(&f, "X-Remote-User"), 0, "nor X-Remote-*");
    is_int(uf_up_count(&f, "Proxy-Authorization"), 0, "hop-by-hop: Proxy-Authorization");
    is_int(uf_up_count(&f, "X-Drop"), 0, "hop-by-hop: what Connection names");
    is_int(uf_up_count(&f, "Te"), 0, "hop-by-hop: Te");
    ok(!uf_up_has(&f, "Keep-Alive: timeout=9"), "hop-by-hop: the caller's Keep-Alive");
    ok(uf_up_has(&f, "X-Keep: 2"), "an end-to-end header forwarded");
    ok(uf_up_has(&f, "Accept: application/json"), "Accept forwarded");
    ok(uf_up_has(&f, "X-Forwarded-For: 198.51.100.1, 192.0.2.7"),
       "X-Forwarded-For: the client appended");
    char host[64];
    snprintf(host, sizeof(host), "Host: 127.0.0.1:%d", f.up.port);
    ok(uf_up_has(&f, host), "Host: the upstream's");
    uf_fini(&f);
    pt_budget_free(c.o.budget);
}

/* --passthrough-identity=forward-token: the caller's own Authorization, as
 * the stages set it, replaces kwc's token. */
static void
test_forward_token(void)
{
    struct pt_case c;
    case_init(&c, true);
    c.ids[0] = (struct http_header){"Authorization", "Bearer caller-token"};
    c.nids = 1;
    struct uf f;
    uf_init(&f, UF_SMALL, pt_handler, &c);
    uf_send(&f, "GET /api HTTP/1.1\r\nHost: kwc\r\nAuthorization: Bearer caller-token\r\n\r\n");
    ok(uf_run_until(&f, answered, "an answer"), "answered");
    is_int(f.resp.status, 200, "200");
    ok(uf_up_has(&f, "Authorization: Bearer caller-token"), "the caller's token");
    is_int(uf_up_count(&f, "Authorization"), 1, "once, and not kwc's");
    uf_fini(&f);
    pt_budget_free(c.o.budget);
}

static void
test_refused(void)
{
    struct pt_case c;
    case_init(&c, true);
    struct uf f;
    uf_init(&f, UF_SMALL, pt_handler, &c);
    /* the port stays bound, nothing listens: every connect is refused */
    shutdown(f.up.lfd, SHUT_RDWR);
    uf_send(&f, "GET /api/v1/pods HTTP/1.1\r\nHost: kwc\r\n\r\n");
    ok(uf_run_until(&f, answered, "an answer"), "answered");
    is_int(f.resp.status, 503, "503, as kube's proxy answers an unavailable backend");
    ok(uf_resp_has(&f.resp, "Retry-After: 1"), "Retry-After: 1");
    ok(uf_resp_has(&f.resp, "Content-Type: application/json"), "a JSON body");
    json_error_t je;
    json_t *st = json_loadb(f.resp.body.p ? f.resp.body.p : "", f.resp.body.len, 0, &je);
    ok(st != NULL, "a Status object");
    is_str(json_string_value(json_object_get(st, "kind")), "Status", "kind Status");
    is_str(json_string_value(json_object_get(st, "status")), "Failure", "status Failure");
    is_str(json_string_value(json_object_get(st, "reason")), "ServiceUnavailable", "reason");
    is_int(json_integer_value(json_object_get(st, "code")), 503, "code");
    const char *m = json_string_value(json_object_get(st, "message"));
    ok(m && strncmp(m, "the upstream API server is unavailable: ", 40) == 0,
       "the message says why");
    json_decref(st);
    is_int(f.up.conns, 0, "nothing reached the upstream");
    uf_fini(&f);
    pt_budget_free(c.o.budget);
}

static bool
client_eof(struct uf *f)
{
    return f->ceof;
}

/* all the body the upstream sent before its cut (the 100 bytes of the
 * chunk it cuts short included) reached the client */
static bool
got_before_cut(struct uf *f)
{
    return f->ceof || f->resp.body.len >= (f->up.mode == UF_CUT_LENGTH ? 5000u : 5100u);
}

static void
test_cut(enum uf_mode mode, const char *what)
{
    tap_group = what;
    struct pt_case c;
    case_init(&c, true);
    struct uf f;
    uf_init(&f, mode, pt_handler, &c);
    uf_send(&f, "GET /api/v1/pods HTTP/1.1\r\nHost: kwc\r\n\r\n");
    ok(uf_run_until(&f, got_before_cut, "the body before the cut"), "the body before the cut");
    ok(!f.ceof, "the client's stream is open until the upstream cuts");
    uf_up_cut(&f.up);
    ok(uf_run_until(&f, client_eof, "the client's stream ends"), "then it ends");
    is_int(f.resp.status, 200, "the upstream's head was relayed");
    is_int(f.resp.heads, 1, "one head: no Status after the cut");
    ok(!f.resp.complete, "the message is incomplete: the client sees the cut");
    ok(!f.resp.bad, "what came is well-formed");
    is_int(f.resp.body.len, mode == UF_CUT_LENGTH ? 5000 : 5100, "the body up to the cut");
    size_t bad_at = f.resp.body.len;
    for (size_t i = 0; i < f.resp.body.len && i < 5000 && bad_at == f.resp.body.len; i++)
        if ((unsigned char)f.resp.body.p[i] != uf_pat(i))
            bad_at = i;
    is_int(bad_at, f.resp.body.len, "intact");
    if (mode == UF_CUT_LENGTH)
        ok(uf_resp_has(&f.resp, "Content-Length: 100000"), "its length as announced");
    uf_fini(&f);
    pt_budget_free(c.o.budget);
    tap_group = "";
}

static void
test_cut_length(void)
{
    test_cut(UF_CUT_LENGTH, "cut, Content-Length");
}

static void
test_cut_chunked(void)
{
    test_cut(UF_CUT_CHUNKED, "cut, chunked");
}

int
main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TAP_RUN(test_decision);
    TAP_RUN(test_flood);
    TAP_RUN(test_streaming);
    TAP_RUN(test_stripping);
    TAP_RUN(test_forward_token);
    TAP_RUN(test_refused);
    TAP_RUN(test_cut_length);
    TAP_RUN(test_cut_chunked);
    return tap_done();
}
