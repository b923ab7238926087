/*
 * body_test.c — proxy/serve/body.c through serve (serve.c): the answers kwc
 * builds from the cache, pretty-printed and gzip'd by kube-apiserver's
 * rules (body.h), as a client reads them over kwc's HTTP server on a
 * socketpair (cachefx.h).
 *
 * Checked: the Accept-Encoding test on its own; the threshold at its edge
 * (a body of exactly BODY_GZIP_MIN bytes stays identity with
 * Content-Length, one byte more is gzip'd: Content-Encoding, Vary, no
 * Content-Length, streamed), the decompressed bytes equal to the identity
 * answer, the first Accept-Encoding line only; pretty lists, gets and
 * Status errors (re-compacted they are the compact answer, they start as
 * MarshalIndent writes and end without a newline); a slow client: the
 * response queue stays bounded for pretty (which grows the body) and gzip
 * alike while the whole list arrives. The loop runs until quiet; no sleeps.
 */
#include "kwc/body.h"
#include "kwc/serve.h"

#include <jansson.h>
#include <zlib.h>

#include "servefx.h"

#define CHUNK_BYTES (64 * 1024) /* serve.c's chunk */

/* GET target with extra header lines (each ending "\r\n"), the answer read
 * whole (the client keeps reading while the server writes). */
static void
ask(struct cfx *f, int c, const char *target, const char *headers, struct cfx_resp *r)
{
    size_t off = f->p[c].in.len;
    char *req = xasprintf("GET %s HTTP/1.1\r\nHost: kwc\r\n%s\r\n", target, headers);
    cfx_send(f, c, req);
    free(req);
    for (int turns = 0; turns < 100000 && f->last_req; turns++) {
        cfx_read(f, c, 0);
        cfx_run(f);
    }
    cfx_read(f, c, 0);
    struct gostr_buf tail = {.p = f->p[c].in.p + off, .len = f->p[c].in.len - off};
    cfx_parse(&tail, r);
}

static bool
has_header(const struct cfx_resp *r, const char *line)
{
    char *want = xasprintf("\r\n%s\r\n", line);
    bool yes = strcasestr(r->head, want) != NULL;
    free(want);
    return yes;
}

/* gunzip in[0..n) into out (new); false when it is not one whole gzip member. */
static bool
gunzip(const struct gostr_buf *in, struct gostr_buf *out)
{
    z_stream z = {0};
    if (inflateInit2(&z, 15 + 16) != Z_OK)
        return false;
    z.next_in = (Bytef *)in->p;
    z.avail_in = (uInt)in->len;
    int rc;
    do {
        char buf[65536];
        z.next_out = (Bytef *)buf;
        z.avail_out = sizeof buf;
        rc = inflate(&z, Z_NO_FLUSH);
        gostr_addn(out, buf, sizeof buf - z.avail_out);
    } while (rc == Z_OK);
    bool whole = rc == Z_STREAM_END && z.avail_in == 0;
    inflateEnd(&z);
    return whole;
}

/* Whitespace outside strings dropped: pretty output back to compact. */
static void
compact(const struct gostr_buf *in, struct gostr_buf *out)
{
    bool str = false, esc = false;
    for (size_t i = 0; i < in->len; i++) {
        char c = in->p[i];
        if (str) {
            str = esc || c != '"';
            esc = !esc && c == '\\';
            gostr_addn(out, &c, 1);
        } else if (c != ' ' && c != '\n') {
            str = c == '"';
            gostr_addn(out, &c, 1);
        }
    }
}

static void
test_accepts_gzip(void)
{
    static const struct {
        const char *h;
        bool gzip;
    } t[] = {
        {"gzip", true},
        {"gzip, deflate", true},
        {"deflate, gzip", true},
        {"deflate,gzip", true},
        {"  gzip\t", true},
        {"br,\tgzip\t,zstd", true},
        {"\xc2\xa0gzip\xe2\x80\x80", true}, /* Go's TrimSpace: U+00A0, U+2000 */
        {"gzip;q=1", false},
        {"gzip;q=0", false},
        {"gzip ;q=1", false},
        {"GZIP", false},
        {"Gzip", false},
        {"*", false},
        {"x-gzip", false},
        {"gzipx", false},
        {"g zip", false},
        {"identity", false},
        {"", false},
        {",", false},
        {"deflate,", false},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char name[80];
        snprintf(name, sizeof name, "Accept-Encoding \"%s\": %s", t[i].h,
                 t[i].gzip ? "gzip" : "identity");
        is_int(body_accepts_gzip(t[i].h), t[i].gzip, name);
    }
    ok(!body_accepts_gzip(NULL), "no header: identity");
}

/* The identity list's body length after changing pod p0000's size. */
static size_t
list_len(struct cfx *f, int c, const char *target, size_t pad)
{
    cfx_event(f, STORE_MODIFIED, "ns", "p0000", pad);
    struct cfx_resp r = {0};
    ask(f, c, target, "", &r);
    size_t n = r.body.len;
    free(r.body.p);
    return n;
}

/* Pod p0000 padded so that the identity answer to target is exactly want
 * bytes (the rvs keep their digits: the length moves with the pad alone). */
static bool
make_len(struct cfx *f, int c, const char *target, size_t want)
{
    size_t pad = 1000;
    for (int i = 0; i < 4; i++) {
        size_t n = list_len(f, c, target, pad);
        if (n == want)
            return true;
        pad = pad + want - n;
    }
    return false;
}

static void
test_threshold(void)
{
    struct cfx f;
    cfx_open(&f, 100, 1000, 1000);
    struct serve *s = serve_open(&f, 1 << 20);
    int c = cfx_connect(&f, 0);
    const char *target = "/api/v1/namespaces/ns/pods?resourceVersion=0";
    struct cfx_resp id = {0}, gz = {0};
    struct gostr_buf plain = {0};

    ok(make_len(&f, c, target, BODY_GZIP_MIN), "a list of exactly 131072 bytes");
    ask(&f, c, target, "", &id);
    ask(&f, c, target, "Accept-Encoding: gzip\r\n", &gz);
    is_int(gz.status, 200, "200");
    ok(!has_header(&gz, "Content-Encoding: gzip"), "131072 bytes: not compressed");
    ok(!strcasestr(gz.head, "Vary:"), "...no Vary");
    ok(has_header(&gz, "Content-Length: 131072"), "...one piece with its Content-Length");
    is_mem(gz.body.p, gz.body.len, id.body.p, id.body.len, "...the identity bytes");

    ok(make_len(&f, c, target, BODY_GZIP_MIN + 1), "a list of 131073 bytes");
    ask(&f, c, target, "", &id);
    ok(!has_header(&id, "Content-Encoding: gzip"), "no Accept-Encoding: identity");
    ask(&f, c, target, "Accept-Encoding: gzip, deflate\r\n", &gz);
    is_int(gz.status, 200, "200");
    ok(has_header(&gz, "Content-Encoding: gzip"), "131073 bytes: Content-Encoding: gzip");
    ok(has_header(&gz, "Vary: Accept-Encoding"), "...Vary: Accept-Encoding");
    ok(!strcasestr(gz.head, "Content-Length:"), "...no Content-Length");
    ok(gz.chunked && gz.complete, "...streamed, complete");
    ok(has_header(&gz, "Content-Type: application/json"), "...still JSON");
    ok(gz.body.len < id.body.len / 4, "...smaller");
    ok(gunzip(&gz.body, &plain), "...one whole gzip stream");
    is_mem(plain.p, plain.len, id.body.p, id.body.len, "...of the identity bytes");

    /* the first Accept-Encoding line decides (Go's Header.Get) */
    ask(&f, c, target, "Accept-Encoding: identity\r\nAccept-Encoding: gzip\r\n", &gz);
    ok(!has_header(&gz, "Content-Encoding: gzip"), "gzip on a second line only: identity");
    is_mem(gz.body.p, gz.body.len, id.body.p, id.body.len, "...the identity bytes");
    ask(&f, c, target, "Accept-Encoding: gzip\r\nAccept-Encoding: identity\r\n", &gz);
    ok(has_header(&gz, "Content-Encoding: gzip"), "gzip on the first line: gzip");
    ask(&f, c, target, "Accept-Encoding: gzip;q=1\r\n", &gz);
    ok(!has_header(&gz, "Content-Encoding: gzip"), "gzip;q=1 is not gzip (kube)");

    /* the threshold counts the body as sent: pretty-printed */
    const char *pretty = "/api/v1/namespaces/ns/pods?resourceVersion=0&pretty=true";
    ok(make_len(&f, c, target, BODY_GZIP_MIN - 1000), "a compact list under the threshold");
    ask(&f, c, pretty, "", &id);
    ok(id.body.len > BODY_GZIP_MIN, "...over it pretty-printed");
    ask(&f, c, target, "Accept-Encoding: gzip\r\n", &gz);
    ok(!has_header(&gz, "Content-Encoding: gzip"), "compact: identity");
    ask(&f, c, pretty, "Accept-Encoding: gzip\r\n", &gz);
    ok(has_header(&gz, "Content-Encoding: gzip"), "pretty: gzip");
    free(plain.p);
    plain = (struct gostr_buf){0};
    ok(gunzip(&gz.body, &plain), "...one whole gzip stream");
    is_mem(plain.p, plain.len, id.body.p, id.body.len, "...of the pretty bytes");

    /* a get larger than the threshold compresses too */
    cfx_event(&f, STORE_MODIFIED, "ns", "p0001", 200 * 1024);
    ask(&f, c, "/api/v1/namespaces/ns/pods/p0001?resourceVersion=0", "", &id);
    ask(&f, c, "/api/v1/namespaces/ns/pods/p0001?resourceVersion=0", "Accept-Encoding: gzip\r\n",
        &gz);
    ok(has_header(&gz, "Content-Encoding: gzip"), "a 200 KiB get: gzip");
    free(plain.p);
    plain = (struct gostr_buf){0};
    ok(gunzip(&gz.body, &plain), "...one whole gzip stream");
    is_mem(plain.p, plain.len, id.body.p, id.body.len, "...of the identity get");

    free(plain.p);
    free(id.body.p);
    free(gz.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

/* pretty: re-compacted it is the compact answer without its newline */
static void
is_pretty_of(const struct cfx_resp *p, const struct cfx_resp *id, const char *start,
             const char *what)
{
    struct gostr_buf back = {0};
    compact(&p->body, &back);
    ok(id->body.len > 0 && id->body.p[id->body.len - 1] == '\n',
       "the compact answer ends with \\n");
    is_mem(back.p, back.len, id->body.p, id->body.len ? id->body.len - 1 : 0, what);
    ok(p->body.len >= strlen(start) && memcmp(p->body.p, start, strlen(start)) == 0,
       "...indented as MarshalIndent writes it");
    ok(p->body.len > 0 && p->body.p[p->body.len - 1] == '}', "...no newline at the end");
    free(back.p);
}

static void
test_pretty(void)
{
    struct cfx f;
    cfx_open(&f, 20, 200, 1000);
    struct serve *s = serve_open(&f, 1 << 20);
    int c = cfx_connect(&f, 0);
    struct cfx_resp id = {0}, p = {0};

    const char *list = "/api/v1/namespaces/ns/pods?resourceVersion=0";
    ask(&f, c, list, "", &id);
    ask(&f, c, "/api/v1/namespaces/ns/pods?resourceVersion=0&pretty=true", "", &p);
    is_int(p.status, 200, "?pretty=true: 200 from the cache");
    is_pretty_of(&p, &id,
                 "{\n  \"kind\": \"PodList\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {",
                 "a pretty list");
    ok(has_header(&p, "Content-Length: " /* prefix */) || strcasestr(p.head, "Content-Length:"),
       "...small: one piece");
    ask(&f, c, list, "User-Agent: curl/8.5.0\r\n", &p);
    is_pretty_of(&p, &id, "{\n  \"kind\": \"PodList\"", "curl's User-Agent: pretty");
    ask(&f, c, "/api/v1/namespaces/ns/pods?resourceVersion=0&pretty=false",
        "User-Agent: curl/8.5.0\r\n", &p);
    is_mem(p.body.p, p.body.len, id.body.p, id.body.len, "?pretty=false beats curl: compact");

    const char *pod = "/api/v1/namespaces/ns/pods/p0003?resourceVersion=0";
    ask(&f, c, pod, "", &id);
    ask(&f, c, pod, "User-Agent: Wget/1.21\r\n", &p);
    is_pretty_of(&p, &id, "{\n  \"kind\": \"Pod\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {\n",
                 "a pretty get");

    /* Status errors are pretty too */
    const char *nope = "/api/v1/namespaces/ns/pods/nope?resourceVersion=0";
    ask(&f, c, nope, "", &id);
    ask(&f, c, nope, "User-Agent: Mozilla/5.0 (X11)\r\n", &p);
    is_int(p.status, 404, "a pretty 404");
    is_pretty_of(&p, &id, "{\n  \"kind\": \"Status\",\n  \"apiVersion\": \"v1\",\n",
                 "...its Status");
    const char *bad = "/api/v1/pods?resourceVersionMatch=NotOlderThan";
    ask(&f, c, bad, "", &id);
    ask(&f, c, "/api/v1/pods?resourceVersionMatch=NotOlderThan&pretty=1", "", &p);
    is_int(p.status, 422, "a pretty 422");
    is_pretty_of(&p, &id, "{\n  \"kind\": \"Status\"", "...its Status");

    free(id.body.p);
    free(p.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

/* A slow client: pretty output (larger than its input) and gzip both leave
 * piece by piece, the queue bounded as for the compact list. */
static void
slow(const char *headers, bool gzip, const char *what)
{
    struct cfx f;
    enum { N = 1500, SIZE = 1000, MAXBUF = 32 * 1024 };
    cfx_open(&f, N, SIZE, 1000);
    struct serve *s = serve_open(&f, MAXBUF);
    int fast = cfx_connect(&f, 0), c = cfx_connect(&f, 8192);
    struct cfx_resp id = {0}, r = {0};
    tap_group = what;
    ask(&f, fast, "/api/v1/pods?resourceVersion=0&pretty=0", "", &id);

    size_t off = f.p[c].in.len;
    char *req =
        xasprintf("GET /api/v1/pods?resourceVersion=0 HTTP/1.1\r\nHost: kwc\r\n%s\r\n", headers);
    cfx_send(&f, c, req);
    free(req);
    ok(f.last_req != NULL, "the list is still being answered while the client reads nothing");
    /* the body writes a piece (at most a chunk) while the queue is below
     * max_buffer / 2, serve's low-water mark */
    size_t bound = MAXBUF / 2 + CHUNK_BYTES, most = 0;
    int turns = 0;
    for (; turns < 100000 && f.last_req; turns++) {
        size_t q = hresp_queued(f.last_req);
        if (q > most)
            most = q;
        cfx_read(&f, c, 4096);
        cfx_run(&f);
    }
    cfx_read(&f, c, 0);
    struct gostr_buf tail = {.p = f.p[c].in.p + off, .len = f.p[c].in.len - off};
    cfx_parse(&tail, &r);
    printf("#   most queued %zu, bound %zu, %d reads\n", most, bound, turns);
    ok(most <= bound, "the queue stayed bounded all along");
    if (!gzip) /* gzip'd, this list (padded with 'x') is a few KiB */
        ok(turns > 5, "the answer took many reads");
    is_int(r.status, 200, "200");
    ok(r.chunked && r.complete, "a chunked stream, ended cleanly");
    struct gostr_buf body = r.body;
    struct gostr_buf plain = {0};
    if (gzip) {
        ok(has_header(&r, "Content-Encoding: gzip"), "gzip");
        ok(gunzip(&r.body, &plain), "one whole gzip stream");
        body = plain;
    }
    struct gostr_buf back = {0};
    compact(&body, &back);
    is_mem(back.p, back.len, id.body.p, id.body.len - 1, "the whole list, intact");
    free(back.p);
    free(plain.p);
    free(id.body.p);
    free(r.body.p);
    cfx_close_http(&f);
    serve_free(s);
    cfx_close(&f);
}

static void
test_slow_client(void)
{
    slow("User-Agent: curl/8\r\n", false, "pretty, slow client");
    slow("Accept-Encoding: gzip\r\n", true, "gzip, slow client");
    slow("Accept-Encoding: gzip\r\nUser-Agent: curl/8\r\n", true, "pretty gzip, slow client");
}

/* body.c's own memory: a small answer holds a small block (client-go asks
 * every answer gzip'd), and a finished gzip answer has let go of zlib and
 * its hold before the request closes. */
static struct body tb;
static size_t tb_n, tb_cap;

static void
take_body(struct cfx *f, struct hreq *r, const struct route_req *route)
{
    body_init(&tb, r, false, true, 1 << 20);
    hresp_header(r, "Content-Type", "application/json");
    body_start(&tb, 200, -1);
    char *p = xmalloc(tb_n);
    memset(p, 'a', tb_n);
    body_write(&tb, p, tb_n);
    free(p);
    tb_cap = tb.buf.cap;
    body_end(&tb);
}

static void
test_memory(void)
{
    struct cfx f;
    cfx_open(&f, 1, 1000, 1000);
    f.take = take_body;
    int c = cfx_connect(&f, 0);
    struct cfx_resp r = {0};

    tb_n = 2000;
    ask(&f, c, "/small", "Accept-Encoding: gzip\r\n", &r);
    is_int(r.status, 200, "a small answer, gzip asked");
    is_int(r.body.len, 2000, "...whole, identity");
    is_int(tb_cap, BODY_HOLD_FIRST, "...held in a block of BODY_HOLD_FIRST, not 128 KiB");
    ok(tb.buf.base == NULL, "...released once sent");
    body_fini(&tb);

    tb_n = 300 * 1024;
    ask(&f, c, "/large", "Accept-Encoding: gzip\r\n", &r);
    ok(has_header(&r, "Content-Encoding: gzip") && r.complete, "a large answer: gzip'd, whole");
    ok(tb.z == NULL, "...zlib's state released when it finished");
    ok(tb.buf.base == NULL && tb.zout.base == NULL, "...and its blocks");
    body_fini(&tb);

    free(r.body.p);
    cfx_close_http(&f);
    cfx_close(&f);
}

int
main(void)
{
    TAP_RUN(test_accepts_gzip);
    TAP_RUN(test_threshold);
    TAP_RUN(test_pretty);
    test_slow_client();
    TAP_RUN(test_memory);
    return tap_done();
}
