/*
 * discocopy.c — discovery's copy of the upstream's answers (disco.h: "the
 * copy"): the recorded documents and their references, the records (most
 * recently used first, within DISCO_COPY_MAX_DOCS and _BYTES) and the
 * reads of the copy, from the loop and from the serving loops (disco.c
 * says how the threads share it). disco.c fetches the records.
 */
#include "disco_int.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/mailbox.h"

/* ---- documents ---- */

void
copy_doc_free(struct doc *doc)
{
    for (size_t i = 0; i < doc->nstrs; i++)
        free(doc->strs[i]);
    free(doc->strs);
    free(doc->h);
    free(doc->body);
    free(doc);
}

void
copy_doc_unref(struct doc *doc)
{
    if (doc && atomic_fetch_sub(&doc->refs, 1) == 1)
        copy_doc_free(doc);
}

void
disco_doc_unref(const struct disco_doc *pub)
{
    if (!pub)
        return;
    /* pub is the first member of a struct doc this module made */
    copy_doc_unref((struct doc *)(uintptr_t)pub);
}

bool
copy_doc_same(const struct doc *a, const struct doc *b)
{
    if (a->pub.len != b->pub.len || memcmp(a->body, b->body, a->pub.len) != 0 ||
        a->pub.nheaders != b->pub.nheaders)
        return false;
    for (size_t i = 0; i < a->pub.nheaders; i++)
        if (strcmp(a->h[i].name, b->h[i].name) != 0 || strcmp(a->h[i].value, b->h[i].value) != 0)
            return false;
    return true;
}

/* ---- records ---- */

void
copy_rec_unlink(struct disco *d, struct drec *r)
{
    pthread_mutex_lock(&d->copy_mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        d->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        d->tail = r->prev;
    r->prev = r->next = NULL;
    pthread_mutex_unlock(&d->copy_mu);
}

void
copy_rec_push_front(struct disco *d, struct drec *r)
{
    pthread_mutex_lock(&d->copy_mu);
    r->next = d->head;
    r->prev = NULL;
    if (d->head)
        d->head->prev = r;
    d->head = r;
    if (!d->tail)
        d->tail = r;
    pthread_mutex_unlock(&d->copy_mu);
}

/* The record's doc, and whether it may be served. */
void
copy_rec_set_doc(struct disco *d, struct drec *r, struct doc *doc, bool current)
{
    struct doc *old = r->doc;
    if (old)
        d->bytes -= old->pub.len;
    pthread_mutex_lock(&d->copy_mu);
    r->doc = doc;
    r->current = current;
    pthread_mutex_unlock(&d->copy_mu);
    copy_doc_unref(old);
    if (doc)
        d->bytes += doc->pub.len;
}

void
copy_rec_set_pin(struct disco *d, struct drec *r, enum pin pin)
{
    pthread_mutex_lock(&d->copy_mu);
    r->pin = pin;
    pthread_mutex_unlock(&d->copy_mu);
}

void
copy_rec_set_current(struct disco *d, struct drec *r, bool current)
{
    pthread_mutex_lock(&d->copy_mu);
    r->current = current;
    pthread_mutex_unlock(&d->copy_mu);
}

void
copy_rec_free(struct disco *d, struct drec *r)
{
    if (r->queued)
        disco_queue_remove(d, r);
    if (r->f)
        r->f->rec = NULL; /* its end finds no record */
    copy_rec_unlink(d, r);
    copy_rec_set_doc(d, r, NULL, false);
    d->ndocs--;
    free(r->path);
    free(r->accept);
    free(r);
}

struct drec *
copy_rec_find(struct disco *d, const char *path, const char *accept)
{
    for (struct drec *r = d->head; r; r = r->next)
        if (strcmp(r->path, path) == 0 && strcmp(r->accept, accept) == 0)
            return r;
    return NULL;
}

/* Past the bounds: the least recently used records that are neither
 * pinned nor in flight go, keep aside (the record being added or filled).
 * The model's own records are never evicted: with more of them than the
 * bounds (a plain upstream with hundreds of group versions) the copy holds
 * them all and nothing else. */
void
copy_evict(struct disco *d, const struct drec *keep)
{
    /* what the serving loops asked for is recently used too */
    for (struct drec *r = d->head, *nx; r; r = nx) {
        nx = r->next;
        if (atomic_exchange(&r->touched, false)) {
            copy_rec_unlink(d, r);
            copy_rec_push_front(d, r);
        }
    }
    struct drec *r = d->tail;
    while (r && (d->ndocs > DISCO_COPY_MAX_DOCS || d->bytes > DISCO_COPY_MAX_BYTES)) {
        struct drec *prev = r->prev;
        if (r->pin == PIN_NONE && !r->f && r != keep)
            copy_rec_free(d, r);
        r = prev;
    }
}

struct drec *
copy_rec_get(struct disco *d, const char *path, const char *accept, enum pin pin)
{
    struct drec *r = copy_rec_find(d, path, accept);
    if (r) {
        if (pin > r->pin)
            copy_rec_set_pin(d, r, pin);
        return r;
    }
    r = xcalloc(1, sizeof(*r));
    r->path = xstrdup(path);
    r->accept = xstrdup(accept);
    r->pin = pin;
    copy_rec_push_front(d, r);
    d->ndocs++;
    copy_evict(d, r);
    return r;
}

/* A path the copy may hold (disco.h). Any thread. */
static bool
copyable(struct disco *d, const char *path)
{
    if (strcmp(path, "/version") == 0 || strcmp(path, "/api") == 0 || strcmp(path, "/apis") == 0)
        return true;
    char seg[3][DDOC_MAX_NAME + 1];
    size_t n = 0;
    const char *p = path;
    while (*p == '/' && n < 3) {
        const char *s = p + 1, *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 || len > DDOC_MAX_NAME)
            return false;
        memcpy(seg[n], s, len);
        seg[n][len] = '\0';
        n++;
        p = s + len;
    }
    if (*p)
        return false;
    bool loop = disco_on_loop(d), ok = false;
    if (!loop)
        pthread_rwlock_rdlock(&d->model_lk);
    if (!d->ready)
        ok = false;
    else if (n == 2 && strcmp(seg[0], "api") == 0)
        ok = ddoc_has_gv(&d->model, "", seg[1]);
    else if (n == 2 && strcmp(seg[0], "apis") == 0)
        ok = ddoc_has_group(&d->model, seg[1]);
    else if (n == 3 && strcmp(seg[0], "apis") == 0)
        ok = ddoc_has_gv(&d->model, seg[1], seg[2]);
    if (!loop)
        pthread_rwlock_unlock(&d->model_lk);
    return ok;
}

/* A record a serving loop missed: made and fetched on the loop. */
struct rec_ask {
    struct disco *d;
    char *path, *accept;
};

static void
run_rec_ask(void *arg)
{
    struct rec_ask *a = arg;
    struct disco *d = a->d;
    if (!d->closing && copyable(d, a->path) && !copy_rec_find(d, a->path, a->accept)) {
        disco_enqueue(d, copy_rec_get(d, a->path, a->accept, PIN_NONE), false);
        disco_pump(d);
    }
    free(a->path);
    free(a->accept);
    free(a);
}

/* disco_doc_get from a serving loop: a lookup under copy_mu; what it would
 * change is marked (atomics) or posted (a new record). */
static const struct disco_doc *
doc_get_remote(struct disco *d, const char *path, const char *accept)
{
    struct doc *got = NULL;
    bool miss = false;
    pthread_mutex_lock(&d->copy_mu);
    struct drec *r = copy_rec_find(d, path, accept);
    if (!r) {
        miss = true;
    } else if (r->pin != PIN_INTERNAL) {
        atomic_store(&r->touched, true);
        atomic_store(&r->in_use, true);
        atomic_store(&r->idle, 0);
        if (r->doc && r->current) {
            atomic_fetch_add(&r->doc->refs, 1);
            got = r->doc;
        }
    }
    pthread_mutex_unlock(&d->copy_mu);
    if (miss) {
        struct rec_ask *a = xcalloc(1, sizeof(*a));
        *a = (struct rec_ask){d, xstrdup(path), xstrdup(accept)};
        mailbox_post(d->mb, run_rec_ask, a);
    }
    return got ? &got->pub : NULL;
}

const struct disco_doc *
disco_doc_get(struct disco *d, const char *path, const char *accept)
{
    assert(d->magic == DISCO_MAGIC);
    if (!accept)
        accept = "";
    if (strlen(accept) > DISCO_ACCEPT_MAX || !copyable(d, path))
        return NULL;
    if (!disco_on_loop(d))
        return doc_get_remote(d, path, accept);
    struct drec *r = copy_rec_find(d, path, accept);
    if (r && r->pin == PIN_INTERNAL)
        return NULL;
    if (!r) {
        r = copy_rec_get(d, path, accept, PIN_NONE);
        disco_enqueue(d, r, false);
        disco_pump(d);
        return NULL;
    }
    if (r != d->head) {
        copy_rec_unlink(d, r);
        copy_rec_push_front(d, r);
    }
    r->in_use = true;
    r->idle = 0;
    if (!r->doc || !r->current) {
        /* a record whose fetch failed is asked again at the next round */
        return NULL;
    }
    r->doc->refs++;
    return &r->doc->pub;
}
