/*
 * index.c — see index.h. Buffers read back from LMDB are validated before any
 * pointer is handed out: every string must end inside the buffer.
 */
#include "kwc/index.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"

int
idx_encode(const struct obj_meta *m, char **out, size_t *out_len)
{
    if (m->n_labels > IDX_MAX_LABELS || m->n_fields > IDX_MAX_FIELDS)
        return KWC_ETOOBIG;
    size_t len = 4;
    for (size_t i = 0; i < m->n_labels; i++)
        len += strlen(m->labels[i].key) + strlen(m->labels[i].value) + 2;
    for (size_t i = 0; i < m->n_fields; i++)
        len += strlen(m->fields[i]) + 1;
    char *b = xmalloc(len), *p = b;
    p[0] = (char)(m->n_labels & 0xff);
    p[1] = (char)(m->n_labels >> 8);
    p[2] = (char)(m->n_fields & 0xff);
    p[3] = (char)(m->n_fields >> 8);
    p += 4;
    for (size_t i = 0; i < m->n_labels; i++) {
        size_t kl = strlen(m->labels[i].key) + 1, vl = strlen(m->labels[i].value) + 1;
        memcpy(p, m->labels[i].key, kl), p += kl;
        memcpy(p, m->labels[i].value, vl), p += vl;
    }
    for (size_t i = 0; i < m->n_fields; i++) {
        size_t fl = strlen(m->fields[i]) + 1;
        memcpy(p, m->fields[i], fl), p += fl;
    }
    *out = b;
    *out_len = len;
    return 0;
}

/* Next NUL-terminated string at *pos, or NULL if it runs past the end. */
static const char *
next_str(const char *b, size_t len, size_t *pos)
{
    if (*pos >= len)
        return NULL;
    const char *s = b + *pos;
    const char *nul = memchr(s, '\0', len - *pos);
    if (!nul)
        return NULL;
    *pos += (size_t)(nul - s) + 1;
    return s;
}

static void
counts(const unsigned char *b, size_t *nl, size_t *nf)
{
    *nl = (size_t)b[0] | (size_t)b[1] << 8;
    *nf = (size_t)b[2] | (size_t)b[3] << 8;
}

int
idx_view_load(struct idx_view *v, const void *buf, size_t len, const char *const *field_names,
              size_t n_fields)
{
    const char *b = buf;
    size_t nl = 0, nf = 0, pos = 4;
    if (len < 4)
        return KWC_EPARSE;
    counts(buf, &nl, &nf);
    size_t need = nl > n_fields ? nl : n_fields;
    if (need > v->lcap) {
        v->lcap = need;
        v->lkeys = xrealloc(v->lkeys, need * sizeof(*v->lkeys));
        v->lvals = xrealloc(v->lvals, need * sizeof(*v->lvals));
        v->fvals = xrealloc(v->fvals, need * sizeof(*v->fvals));
    }
    for (size_t i = 0; i < nl; i++) {
        v->lkeys[i] = next_str(b, len, &pos);
        v->lvals[i] = next_str(b, len, &pos);
        if (!v->lkeys[i] || !v->lvals[i])
            return KWC_EPARSE;
    }
    /* Fields the object was not indexed with (the resource gained fields) read as "". */
    for (size_t i = 0; i < n_fields; i++) {
        const char *f = i < nf ? next_str(b, len, &pos) : "";
        if (!f)
            return KWC_EPARSE;
        v->fvals[i] = f;
    }
    v->labels = (struct sel_labels){.keys = v->lkeys, .values = v->lvals, .n = nl};
    v->fields = (struct sel_fields){.names = field_names, .values = v->fvals, .n = n_fields};
    return 0;
}

void
idx_view_fini(struct idx_view *v)
{
    free(v->lkeys);
    free(v->lvals);
    free(v->fvals);
    memset(v, 0, sizeof(*v));
}

const char *
idx_field(const void *buf, size_t len, size_t i)
{
    const char *b = buf;
    size_t nl, nf, pos = 4;
    if (len < 4)
        return NULL;
    counts(buf, &nl, &nf);
    if (i >= nf)
        return NULL;
    for (size_t j = 0; j < 2 * nl + i; j++)
        if (!next_str(b, len, &pos))
            return NULL;
    return next_str(b, len, &pos);
}
