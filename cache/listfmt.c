/*
 * listfmt.c — list and object framing (see listfmt.h). Kinds and API
 * versions come from discovery and are written as they are; the reflector
 * only accepts ones made of [A-Za-z0-9./-], which JSON needs no escape for.
 */
#include "kwc/listfmt.h"

#include <string.h>

#include "kwc/base.h"
#include "kwc/gostr.h"

static void
add_rv(struct gostr_buf *b, uint64_t rv)
{
    gostr_add(b, "\"resourceVersion\":\"");
    gostr_addu(b, rv);
    gostr_addc(b, '"');
}

static char *
take(struct gostr_buf *b, size_t *len)
{
    *len = b->len;
    return gostr_take(b);
}

char *
listfmt_head(const struct listfmt *f, const struct listfmt_meta *m, size_t *len)
{
    struct gostr_buf b = {0};
    if (f->unstructured) {
        gostr_add(&b, "{\"apiVersion\":\"");
        gostr_add(&b, f->api_version);
        gostr_add(&b, "\",\"items\":[");
        return take(&b, len);
    }
    gostr_add(&b, "{\"kind\":\"");
    gostr_add(&b, f->list_kind);
    gostr_add(&b, "\",\"apiVersion\":\"");
    gostr_add(&b, f->api_version);
    gostr_add(&b, "\",\"metadata\":{");
    add_rv(&b, m->rv);
    if (m->cont && m->cont[0]) {
        gostr_add(&b, ",\"continue\":\"");
        gostr_add(&b, m->cont);
        gostr_addc(&b, '"');
    }
    if (m->remaining >= 0) {
        gostr_add(&b, ",\"remainingItemCount\":");
        gostr_addu(&b, (uint64_t)m->remaining);
    }
    gostr_add(&b, "},\"items\":[");
    return take(&b, len);
}

char *
listfmt_tail(const struct listfmt *f, const struct listfmt_meta *m, size_t *len)
{
    struct gostr_buf b = {0};
    if (!f->unstructured) {
        gostr_add(&b, "]}\n");
        return take(&b, len);
    }
    gostr_add(&b, "],\"kind\":\"");
    gostr_add(&b, f->list_kind);
    gostr_add(&b, "\",\"metadata\":{\"continue\":\"");
    gostr_add(&b, m->cont ? m->cont : "");
    gostr_addc(&b, '"');
    if (m->remaining >= 0) {
        gostr_add(&b, ",\"remainingItemCount\":");
        gostr_addu(&b, (uint64_t)m->remaining);
    }
    gostr_addc(&b, ',');
    add_rv(&b, m->rv);
    gostr_add(&b, "}}\n");
    return take(&b, len);
}

char *
listfmt_object(const struct listfmt *f, const void *item, size_t len, size_t *out_len)
{
    const char *p = item;
    struct gostr_buf b = {0};
    if (!f->unstructured && len > 0 && p[0] == '{') {
        gostr_add(&b, "{\"kind\":\"");
        gostr_add(&b, f->kind);
        gostr_add(&b, "\",\"apiVersion\":\"");
        gostr_add(&b, f->api_version);
        gostr_add(&b, "\"");
        /* an empty object "{}" keeps its brace; else a comma joins the rest */
        if (len > 1 && p[1] != '}')
            gostr_addc(&b, ',');
        gostr_addn(&b, p + 1, len - 1);
    } else {
        gostr_addn(&b, p, len);
    }
    gostr_addc(&b, '\n');
    return take(&b, out_len);
}
