/*
 * config_fuzz.c — libFuzzer target for cfg_parse: the --config YAML file and
 * the command line.
 *
 * The first byte picks the mode. Even: the rest is the YAML file, written to
 * one temp file per process under $TMPDIR (rewritten each run) and read through
 * --config FILE with --upstream and --data-dir on the command line. Odd: the
 * rest is argv, one argument per line; arguments starting with "--config" are
 * dropped so an input cannot name a file that blocks (a FIFO, /dev/stdin).
 * Each result is checked against config.h's contract.
 */
#include "kwc/config.h"

#include "kwc/base.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char cfg_path[4096];

static void
remove_cfg(void)
{
    if (cfg_path[0])
        unlink(cfg_path);
}

/* The temp file (cfg_path), created on first use and removed at exit. */
static void
write_cfg(const uint8_t *data, size_t size)
{
    if (!cfg_path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(cfg_path, sizeof cfg_path, "%s/kwc_config_fuzz.XXXXXX",
                 dir && *dir ? dir : "/tmp");
        int fd = mkstemp(cfg_path);
        if (fd < 0)
            abort();
        close(fd);
        atexit(remove_cfg);
    }
    FILE *f = fopen(cfg_path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        abort();
}

static void
check(int rc, const struct kwc_config *c, const char *err, size_t errlen)
{
    if (rc == KWC_ECONFIG) {
        const char *nul = memchr(err, '\0', errlen);
        if (!nul || nul == err)
            abort(); /* a message for a person, always */
        return;
    }
    if (rc == CFG_SHOW_HELP || rc == CFG_SHOW_VERSION)
        return;
    if (rc != 0)
        abort();
    if (!c->data_dir || !*c->data_dir || !c->listen_host)
        abort();
    if (c->upstream && c->kubeconfig)
        abort();
    if (c->listen_port < 0 || c->listen_port > 65535)
        abort();
    if (!c->listen_loopback && !c->insecure_allow_remote)
        abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        unsetenv("KUBERNETES_SERVICE_HOST");
        once = 1;
    }
    if (size < 1)
        return 0;
    char err[256];
    memset(err, 'X', sizeof err);
    struct kwc_config c;
    int rc;

    if ((data[0] & 1) == 0) {
        write_cfg(data + 1, size - 1);
        char a0[] = "kwc", a1[] = "--config", a3[] = "--upstream", a4[] = "http://127.0.0.1:1",
             a5[] = "--data-dir", a6[] = "/nonexistent-kwc-fuzz";
        char *argv[] = {a0, a1, cfg_path, a3, a4, a5, a6, NULL};
        rc = cfg_parse(7, argv, &c, err, sizeof err);
    } else {
        /* argv from lines; the copy is NUL-terminated where the lines end. */
        char *buf = xmalloc(size);
        memcpy(buf, data + 1, size - 1);
        buf[size - 1] = '\0';
        char a0[] = "kwc";
        char *argv[33] = {a0};
        int argc = 1;
        for (char *line = buf, *next; line && argc < 32; line = next) {
            next = strchr(line, '\n');
            if (next)
                *next++ = '\0';
            if (strncmp(line, "--config", 8) != 0)
                argv[argc++] = line;
        }
        argv[argc] = NULL;
        rc = cfg_parse(argc, argv, &c, err, sizeof err);
        free(buf);
    }
    check(rc, &c, err, sizeof err);
    cfg_fini(&c);
    return 0;
}
