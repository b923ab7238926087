/*
 * tlsrecord.c — what one TLS record costs the server that writes it, with
 * Debian's OpenSSL, beside the AEAD alone and the write(2) alone: the floor
 * under kwc's CPU per watch delivery over TLS (one SSL_write per delivery,
 * or per k deliveries gathered into one record). No kwc, no libevent.
 *
 *   tlsrecord [--iterations N] [--sizes 256,1024,3072,16384] [--batches B]
 *             [--conns N]
 *
 * A server SSL and a client SSL in this process go through a real handshake
 * over a BIO pair (an EC P-256 certificate made here with EVP_EC_gen and the
 * X509 API, no files; no session tickets). Then the server's write BIO is
 * replaced and only the server's SSL_write of one record of each size is
 * timed:
 *   - into a null BIO (the bytes are dropped): OpenSSL's record layer and
 *     the AEAD, no syscall;
 *   - into a socket BIO on a loopback TCP connection (TCP_NODELAY, as kwc's
 *     sockets) that a reader thread drains without decrypting: what a
 *     delivery costs kwc over TLS, syscall included. Its figures depend on
 *     how often the writer wakes the reader (the last column): a faster
 *     writer fills the socket between the reader's turns and wakes it less
 *     per write, so write(2) alone looks cheaper than inside an SSL_write.
 * For TLS 1.3 AES-128-GCM, TLS 1.3 CHACHA20-POLY1305 and TLS 1.2
 * ECDHE-ECDSA-AES128-GCM-SHA256, each with SSL_MODE_RELEASE_BUFFERS on (kwc)
 * and off, and with and without ERR_clear_error() before each SSL_write
 * (kwc calls it). Beside them: the bare EVP seal libssl does per TLS 1.3
 * record (EVP_EncryptInit_ex with a new IV, the 5-byte AAD, update, final,
 * get tag; in place, as libssl), the TLS 1.2 one-shot form libssl uses for
 * GCM (EVP_CTRL_AEAD_TLS1_AAD + one EVP_Cipher), and write(2) of the same
 * bytes to the loopback TCP socket (the plaintext path's floor).
 *
 * Time is the writing thread's CPU time (CLOCK_THREAD_CPUTIME_ID): on a
 * shared machine another process's run does not count, and the kernel's
 * loopback work done in the writer's context (the receiver's softirq) does,
 * as it does for kwc. Each figure is the median of B batches of N/B
 * operations after a warm-up, in ns per operation (one record / one write).
 * The last column: the writing thread's context switches (voluntary and
 * not) per 1,000 operations over the row: on loopback TCP the reader's
 * wake-ups, which change what a write(2) costs.
 *
 * --conns N (issue 32, part 4): the same writes spread over N connections
 * in turn, one record each, as a watch worker's flush round writes one
 * event to each of its watchers: TLS 1.3 AES-128-GCM (kwc's modes, into
 * the null BIO) and the bare seal, each over N contexts, beside the one
 * context rows. What one connection's state costs when the others have
 * pushed it out of the caches (N SSLs of ~7 KiB with their cipher state,
 * plus OpenSSL's record buffer malloc'd and freed per write). Also the
 * AES-256-GCM seal: `openssl speed -evp aes-256-gcm` is the yardstick.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 16
#define MAX_RECORD 16384
#define MAX_BATCHES 64

static long iterations = 200000;
static int batches = 7;
static size_t sizes[MAX_SIZES] = {256, 1024, 3072, 16384};
static int nsizes = 4;
static int conns = 1; /* --conns: connections written to in turn */
static unsigned char plain[MAX_RECORD + 64];

static void
die(const char *what)
{
    fprintf(stderr, "tlsrecord: %s\n", what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

static int64_t
cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One operation of a measured path: size bytes. */
typedef void (*op_fn)(void *arg, size_t size);

/* Median over the batches of ns per op, after a warm-up batch. */
static double
measure(op_fn op, void *arg, size_t size)
{
    long per = iterations / batches;
    if (per < 1)
        per = 1;
    double ns[MAX_BATCHES];
    for (long i = 0; i < per / 4 + 1; i++)
        op(arg, size);
    for (int b = 0; b < batches; b++) {
        int64_t t0 = cpu_ns();
        for (long i = 0; i < per; i++)
            op(arg, size);
        ns[b] = (double)(cpu_ns() - t0) / (double)per;
    }
    qsort(ns, (size_t)batches, sizeof(ns[0]), cmp_double);
    return ns[batches / 2];
}

static void
row(const char *name, op_fn op, void *arg)
{
    struct rusage ru0, ru1;
    getrusage(RUSAGE_THREAD, &ru0);
    printf("%-60s", name);
    for (int i = 0; i < nsizes; i++)
        printf("  %8.0f", measure(op, arg, sizes[i]));
    getrusage(RUSAGE_THREAD, &ru1);
    long csw = ru1.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nvcsw - ru0.ru_nivcsw;
    long ops = (iterations / batches) * (batches + 1) * nsizes; /* about: with the warm-ups */
    printf("  %6.1f\n", 1000.0 * (double)csw / (double)ops);
    fflush(stdout);
}

/* ---- the certificate ---- */

static EVP_PKEY *key;
static X509 *cert;

static void
make_cert(void)
{
    key = EVP_EC_gen("P-256");
    cert = X509_new();
    if (!key || !cert)
        die("cannot make a key");
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
    X509_set_pubkey(cert, key);
    X509_NAME *name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"tlsrecord", -1, -1,
                               0);
    X509_set_issuer_name(cert, name);
    if (!X509_sign(cert, key, EVP_sha256()))
        die("cannot sign the certificate");
}

/* ---- TLS ---- */

struct suite {
    const char *name;
    int version;
    const char *ciphers; /* TLS 1.3 suites or TLS 1.2 cipher list */
};

static const struct suite suites[] = {
    {"TLS1.3 AES-128-GCM", TLS1_3_VERSION, "TLS_AES_128_GCM_SHA256"},
    {"TLS1.3 CHACHA20-POLY1305", TLS1_3_VERSION, "TLS_CHACHA20_POLY1305_SHA256"},
    {"TLS1.2 ECDHE-ECDSA-AES128-GCM", TLS1_2_VERSION, "ECDHE-ECDSA-AES128-GCM-SHA256"},
};

/* What runs before each SSL_write: nothing, ERR_clear_error (kwc), or
 * ERR_clear_error only when ERR_peek_error finds an error queued (the same
 * for SSL_get_error, which looks at the queue). */
enum { CLR_OFF, CLR_ON, CLR_PEEK };
static const char *const clr_name[] = {"off", "on", "peek"};

struct tls {
    SSL_CTX *sctx, *cctx;
    SSL *s, *c;
    int clear; /* before each SSL_write: CLR_* */
};

/* A server and a client SSL through a full handshake over a BIO pair; the
 * server's write BIO then becomes wbio. */
static void tls_open_in(struct tls *t, const struct suite *su, bool release, int clear, BIO *wbio,
                        const struct tls *share);

static void
tls_open(struct tls *t, const struct suite *su, bool release, int clear, BIO *wbio)
{
    tls_open_in(t, su, release, clear, wbio, NULL);
}

/* share: another connection whose contexts this one uses (not freed with
 * it), or NULL for contexts of its own. */
static void
tls_open_in(struct tls *t, const struct suite *su, bool release, int clear, BIO *wbio,
            const struct tls *share)
{
    memset(t, 0, sizeof(*t));
    t->clear = clear;
    if (share) {
        t->sctx = share->sctx;
        t->cctx = share->cctx;
        SSL_CTX_up_ref(t->sctx);
        SSL_CTX_up_ref(t->cctx);
    } else {
        t->sctx = SSL_CTX_new(TLS_server_method());
        t->cctx = SSL_CTX_new(TLS_client_method());
    }
    if (!t->sctx || !t->cctx)
        die("SSL_CTX_new");
    SSL_CTX *both[2] = {t->sctx, t->cctx};
    for (int i = 0; i < 2 && !share; i++) {
        SSL_CTX_set_min_proto_version(both[i], su->version);
        SSL_CTX_set_max_proto_version(both[i], su->version);
        if (su->version == TLS1_3_VERSION ? SSL_CTX_set_ciphersuites(both[i], su->ciphers) != 1
                                          : SSL_CTX_set_cipher_list(both[i], su->ciphers) != 1)
            die("cannot set the cipher");
    }
    SSL_CTX_set_num_tickets(t->sctx, 0);
    if (!share &&
        (SSL_CTX_use_certificate(t->sctx, cert) != 1 || SSL_CTX_use_PrivateKey(t->sctx, key) != 1))
        die("cannot use the certificate");
    t->s = SSL_new(t->sctx);
    t->c = SSL_new(t->cctx);
    BIO *bs, *bc;
    if (!t->s || !t->c || BIO_new_bio_pair(&bs, 0, &bc, 0) != 1)
        die("SSL_new");
    SSL_set_bio(t->s, bs, bs);
    SSL_set_bio(t->c, bc, bc);
    SSL_set_accept_state(t->s);
    SSL_set_connect_state(t->c);
    bool sdone = false, cdone = false;
    for (int i = 0; i < 100 && !(sdone && cdone); i++) {
        if (!cdone && SSL_do_handshake(t->c) == 1)
            cdone = true;
        if (!sdone && SSL_do_handshake(t->s) == 1)
            sdone = true;
    }
    if (!sdone || !cdone)
        die("handshake failed");
    /* one record through, read by the client: the keys work */
    char buf[16];
    if (SSL_write(t->s, "hello", 5) != 5 || SSL_read(t->c, buf, sizeof(buf)) != 5 ||
        memcmp(buf, "hello", 5) != 0)
        die("the first record did not arrive");
    const SSL_CIPHER *ci = SSL_get_current_cipher(t->s);
    if (SSL_version(t->s) != su->version || !ci)
        die("unexpected version");
    /* kwc's modes; the read side stays on the pair */
    SSL_set_mode(t->s, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (release)
        SSL_set_mode(t->s, SSL_MODE_RELEASE_BUFFERS);
    else
        SSL_clear_mode(t->s, SSL_MODE_RELEASE_BUFFERS);
    BIO_up_ref(bs); /* still the read BIO: SSL_set0_wbio frees the old write BIO */
    SSL_set0_wbio(t->s, wbio);
}

static void
tls_close(struct tls *t)
{
    SSL_free(t->s);
    SSL_free(t->c);
    SSL_CTX_free(t->sctx);
    SSL_CTX_free(t->cctx);
}

static void
op_ssl_write(void *arg, size_t size)
{
    struct tls *t = arg;
    if (t->clear == CLR_ON || (t->clear == CLR_PEEK && ERR_peek_error()))
        ERR_clear_error();
    if (SSL_write(t->s, plain, (int)size) != (int)size)
        die("SSL_write");
}

static void
op_err_clear(void *arg, size_t size)
{
    ERR_clear_error();
}

static void
op_err_peek(void *arg, size_t size)
{
    if (ERR_peek_error())
        die("an error queued");
}

/* ---- loopback TCP with a reader thread ---- */

static int tcp_fd = -1; /* the writer's end */

static void *
reader(void *arg)
{
    int fd = (int)(intptr_t)arg;
    static char buf[1 << 18];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
    return NULL;
}

static void
tcp_open(pthread_t *th)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0)
        die("cannot listen on loopback");
    tcp_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (tcp_fd < 0 || connect(tcp_fd, (struct sockaddr *)&a, sizeof(a)) < 0)
        die("cannot connect on loopback");
    int r = accept(l, NULL, NULL);
    if (r < 0)
        die("accept");
    close(l);
    int one = 1;
    setsockopt(tcp_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (pthread_create(th, NULL, reader, (void *)(intptr_t)r) != 0)
        die("pthread_create");
}

static void
op_write(void *arg, size_t size)
{
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(tcp_fd, plain + off, size - off);
        if (n < 0 && errno != EINTR)
            die("write");
        if (n > 0)
            off += (size_t)n;
    }
}

/* ---- the bare AEAD ---- */

struct aead {
    EVP_CIPHER_CTX *ctx;
    unsigned char iv[12];
    unsigned char *buf; /* own, or another context's (--conns: one buffer, as libssl's) */
    unsigned char own[MAX_RECORD + 64];
    bool tls12; /* the TLS 1.2 one-shot form */
};

static void
aead_open(struct aead *a, const char *cipher, bool tls12)
{
    static const unsigned char k[32] = {1, 2, 3};
    memset(a, 0, sizeof(*a));
    a->buf = a->own;
    a->tls12 = tls12;
    EVP_CIPHER *c = EVP_CIPHER_fetch(NULL, cipher, NULL); /* as libssl: fetched once */
    a->ctx = EVP_CIPHER_CTX_new();
    if (!c || !a->ctx || EVP_EncryptInit_ex(a->ctx, c, NULL, k, NULL) != 1)
        die("cannot set up the cipher");
    EVP_CIPHER_free(c);
    unsigned char fixed[4] = {1, 2, 3, 4};
    if (tls12 && EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_GCM_SET_IV_FIXED, 4, fixed) != 1)
        die("cannot set the fixed IV");
}

static void
op_aead(void *arg, size_t size)
{
    struct aead *a = arg;
    /* TLS 1.3: the record header is the AAD; the content type byte is sealed
     * with the plaintext */
    unsigned char aad[5] = {0x17, 3, 3, (unsigned char)((size + 17) >> 8),
                            (unsigned char)(size + 17)};
    if (a->tls12) {
        /* seq(8) type version length(2): the length is the plaintext's;
         * the buffer is explicit nonce (8) | plaintext | tag (16) */
        unsigned char tls_aad[13] = {
            0, 0, 0, 0, 0, 0, 0, 1, 0x17, 3, 3, (unsigned char)(size >> 8), (unsigned char)size};
        if (EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_TLS1_AAD, 13, tls_aad) != 16 ||
            EVP_Cipher(a->ctx, a->buf, a->buf, (unsigned int)(size + 24)) <= 0)
            die("TLS 1.2 seal");
        return;
    }
    int outl, finl;
    for (int i = 11; i >= 4 && ++a->iv[i] == 0; i--)
        ;
    if (EVP_EncryptInit_ex(a->ctx, NULL, NULL, NULL, a->iv) != 1 ||
        EVP_EncryptUpdate(a->ctx, NULL, &outl, aad, 5) != 1 ||
        EVP_EncryptUpdate(a->ctx, a->buf, &outl, a->buf, (int)size + 1) != 1 ||
        EVP_EncryptFinal_ex(a->ctx, a->buf + outl, &finl) != 1 ||
        EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, 16, a->buf + size + 1) != 1)
        die("seal");
}

/* ---- many connections in turn (--conns) ---- */

struct many {
    struct tls *t;
    struct aead *a;
    int n, next;
};

static void
op_many_ssl_write(void *arg, size_t size)
{
    struct many *m = arg;
    op_ssl_write(&m->t[m->next], size);
    m->next = (m->next + 1) % m->n;
}

static void
op_many_aead(void *arg, size_t size)
{
    struct many *m = arg;
    op_aead(&m->a[m->next], size);
    m->next = (m->next + 1) % m->n;
}

static void
many_rows(void)
{
    char name[128];
    struct many m = {.n = conns};
    m.a = calloc((size_t)conns, sizeof(*m.a));
    m.t = calloc((size_t)conns, sizeof(*m.t));
    if (!m.a || !m.t)
        die("out of memory");
    for (int i = 0; i < conns; i++) {
        aead_open(&m.a[i], "AES-128-GCM", false);
        m.a[i].buf = m.a[0].own; /* one warm buffer, as libssl's malloc'd-and-freed record buffer */
    }
    snprintf(name, sizeof(name), "EVP AES-128-GCM seal (TLS1.3 form), %d contexts", conns);
    row(name, op_many_aead, &m);
    for (int i = 0; i < conns; i++)
        EVP_CIPHER_CTX_free(m.a[i].ctx);
    for (int rel = 1; rel >= 0; rel--) {
        for (int i = 0; i < conns; i++)
            tls_open_in(&m.t[i], &suites[0], rel, CLR_PEEK, BIO_new(BIO_s_null()),
                        i ? &m.t[0] : NULL);
        m.next = 0;
        snprintf(name, sizeof(name), "SSL_write TLS1.3 AES-128-GCM rel=%s clr=peek null, %d conns",
                 rel ? "on" : "off", conns);
        row(name, op_many_ssl_write, &m);
        for (int i = 0; i < conns; i++)
            tls_close(&m.t[i]);
    }
    free(m.t);
    free(m.a);
}

/* ---- main ---- */

static void
usage(void)
{
    fprintf(stderr, "usage: tlsrecord [--iterations N] [--sizes 256,1024,3072,16384] "
                    "[--batches B] [--conns N]\n");
    exit(2);
}

static void
parse_sizes(const char *s)
{
    nsizes = 0;
    char *end;
    while (*s) {
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v < 1 || v > MAX_RECORD || nsizes == MAX_SIZES)
            usage();
        sizes[nsizes++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            usage();
    }
    if (!nsizes)
        usage();
}

int
main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
            iterations = atol(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
            batches = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            parse_sizes(argv[++i]);
        else if (!strcmp(argv[i], "--conns") && i + 1 < argc)
            conns = atoi(argv[++i]);
        else
            usage();
    }
    if (iterations < 1 || batches < 1 || batches > MAX_BATCHES || conns < 1 || conns > 100000)
        usage();
    memset(plain, 'x', sizeof(plain));
    make_cert();
    pthread_t th;
    tcp_open(&th);

    printf("# %s; ns of the writing thread's CPU per op, median of %d batches of %ld\n",
           OpenSSL_version(OPENSSL_VERSION), batches, iterations / batches);
    printf("%-60s", "path \\ bytes per record");
    for (int i = 0; i < nsizes; i++)
        printf("  %8zu", sizes[i]);
    printf("  csw/kop\n");

    struct aead a;
    aead_open(&a, "AES-128-GCM", false);
    row("EVP AES-128-GCM seal (TLS1.3 form)", op_aead, &a);
    EVP_CIPHER_CTX_free(a.ctx);
    aead_open(&a, "AES-256-GCM", false);
    row("EVP AES-256-GCM seal (TLS1.3 form)", op_aead, &a);
    EVP_CIPHER_CTX_free(a.ctx);
    aead_open(&a, "AES-128-GCM", true);
    row("EVP AES-128-GCM seal (TLS1.2 one-shot)", op_aead, &a);
    EVP_CIPHER_CTX_free(a.ctx);
    aead_open(&a, "ChaCha20-Poly1305", false);
    row("EVP CHACHA20-POLY1305 seal (TLS1.3 form)", op_aead, &a);
    EVP_CIPHER_CTX_free(a.ctx);
    row("write(2) loopback TCP", op_write, NULL);

    row("ERR_clear_error() (no error queued)", op_err_clear, NULL);
    row("ERR_peek_error() (no error queued)", op_err_peek, NULL);

    /* release buffers, clear: kwc's today first */
    static const struct {
        bool release;
        int clear;
        bool tcp;
    } modes[] = {
        {true, CLR_ON, false},  {true, CLR_PEEK, false}, {true, CLR_OFF, false},
        {false, CLR_ON, false}, {false, CLR_OFF, false}, {true, CLR_ON, true},
        {true, CLR_PEEK, true}, {false, CLR_ON, true},   {false, CLR_PEEK, true},
    };
    if (conns > 1) {
        many_rows();
        goto out;
    }
    for (size_t su = 0; su < sizeof(suites) / sizeof(suites[0]); su++) {
        for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
            struct tls t;
            char name[128];
            BIO *wbio = modes[m].tcp ? BIO_new_socket(tcp_fd, BIO_NOCLOSE) : BIO_new(BIO_s_null());
            tls_open(&t, &suites[su], modes[m].release, modes[m].clear, wbio);
            snprintf(name, sizeof(name), "SSL_write %s rel=%s clr=%s %s", suites[su].name,
                     modes[m].release ? "on" : "off", clr_name[modes[m].clear],
                     modes[m].tcp ? "tcp" : "null");
            row(name, op_ssl_write, &t);
            tls_close(&t);
        }
    }
out:
    shutdown(tcp_fd, SHUT_WR);
    pthread_join(th, NULL);
    close(tcp_fd);
    X509_free(cert);
    EVP_PKEY_free(key);
    return 0;
}
