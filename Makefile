# kwc — watch-cache reverse proxy for the Kubernetes API.
#   make            build build/kwc
#   make test       deps, unit tests, integration tests (the CI command)
#   make integration [IT="01_ 05_"]       integration tests (kwc serves plain HTTP)
#   make integration-tls [IT=...]         the same with kwc serving TLS (KWC_TLS=1)
#   make integration-h2 [IT=...]          the same speaking HTTP/2 to kwc (KWC_H2=1, prior knowledge)
#   make run        demo: apisim with a demo cluster and kwc in front
#   make bench      benchmarks (results in bench/results/)
#   make asan       ASan+UBSan build in build/asan and the unit tests under it
#   make tsan       ThreadSanitizer build in build/tsan and integration modules (IT_TSAN) under it
#   make fuzz       libFuzzer targets (clang) in build/fuzz
#   make deps       install Debian/npm packages (as root) or say how
#   make image      container image from the Dockerfile (podman; CONTAINER=buildah|docker)
#   make image-test build the image and run it as the Deployment does (part of make test)
#   make check-layering   the rooms and what each may include (tests/lib/layering.py)
#   make check-format     the C files as clang-format-14 writes them; make format fixes them
#   make check-docs       the docs against kwc: --help's flags, /metrics' families, links (tests/lib/checkdocs.py)
# Variables: V=1 shows commands, WERROR=0 for packagers, SAN=address,undefined,
# PROTOC_C=protoc-c (compiles cache/k8s_min.proto into $(BUILD)/gen),
# IMAGE=name:tag and CONTAINER=podman|buildah|docker for make image.

CC ?= gcc
PROTOC_C ?= protoc-c
PKG_CONFIG ?= pkg-config
PYTHON ?= /usr/bin/python3
WERROR ?= 1
SAN ?=
V ?= 0

ifeq ($(SAN),)
BUILD ?= build
else
BUILD ?= build/san
endif

ifeq ($(V),0)
Q = @
say = @printf '  %-6s %s\n' $(1) $(2);
else
Q =
say =
endif

PKGS := jansson libevent libevent_openssl libevent_pthreads libcurl yaml-0.1 lmdb \
        libprotobuf-c openssl libnghttp2 zlib

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
        -Wvla -Wpointer-arith -Wcast-qual -Wwrite-strings -Wundef -Wnull-dereference \
        -Wimplicit-fallthrough -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN += -Werror
endif

CFLAGS ?= -O2 -g
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) -Iinclude -I$(BUILD)/gen \
              $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null) -MMD -MP
# Debian's libhttp-parser ships no .pc file.
LIBS := $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null) -lhttp_parser -lpthread -lm
LDFLAGS ?=
export PKGS LIBS

ifneq ($(SAN),)
ALL_CFLAGS += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all -O1
LDFLAGS += -fsanitize=$(SAN)
endif

CACHE_SRC := $(sort $(wildcard cache/*.c))
PROXY_SRC := $(filter-out proxy/main.c,$(sort $(wildcard proxy/*.c proxy/*/*.c)))
# kwc's own protobuf schema (cache/pb.c decodes with it), compiled by protoc-c
# into $(BUILD)/gen: k8s_min.pb-c.h is included as "k8s_min.pb-c.h".
GEN_C := $(BUILD)/gen/k8s_min.pb-c.c
GEN_H := $(BUILD)/gen/k8s_min.pb-c.h
GEN_OBJ := $(BUILD)/gen/k8s_min.pb-c.o
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(CACHE_SRC) $(PROXY_SRC)) $(GEN_OBJ)
MAIN_OBJ := $(BUILD)/proxy/main.o
UNIT_SRC := $(sort $(wildcard tests/unit/*_test.c))
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRC))
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all deps deps-test deps-bench image image-test test unit integration integration-tls integration-h2 \
        integration-checked tsan run bench asan \
        fuzz fuzz-smoke clean \
        check-layering check-format check-docs format
.DEFAULT_GOAL := all

all: $(BUILD)/kwc

deps:
	$(Q)tests/lib/deps.sh build
deps-test:
	$(Q)tests/lib/deps.sh test
deps-bench:
	$(Q)tests/lib/deps.sh bench

# The container image (Dockerfile: bookworm build stage, bookworm-slim runtime,
# non-root). podman is Debian's container tool (tests/lib/deps.sh image installs
# it); buildah and docker take the same arguments. --network host: the RUN
# steps only fetch Debian packages, and a rootful podman then needs no CNI
# bridge or iptables.
# IMAGE_BUILD_ARGS: more build flags (--build-arg DEBIAN_IMAGE=..., --ulimit ...).
KWC_VERSION := $(shell sed -n 's/^\#define KWC_VERSION "\(.*\)"/\1/p' include/kwc/version.h)
CONTAINER ?= podman
IMAGE ?= kwc:$(KWC_VERSION)
IMAGE_BUILD_ARGS ?=
image:
ifeq ($(notdir $(firstword $(CONTAINER))),podman)
	$(Q)tests/lib/deps.sh image
endif
	$(Q)$(CONTAINER) build --network host $(IMAGE_BUILD_ARGS) -f Dockerfile -t $(IMAGE) .

# Builds the image with podman and runs it like the Deployment does
# (tests/image/test_image.py; see there for what this machine needs).
image-test:
	$(Q)tests/lib/deps.sh image-test
	$(Q)$(MAKE) --no-print-directory all
	$(Q)KWC_BIN=$(abspath $(BUILD)/kwc) $(PYTHON) tests/image/test_image.py

$(BUILD)/kwc: $(LIB_OBJ) $(MAIN_OBJ)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/libkwc.a: $(LIB_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) -c -o $@ $<

# protoc-c writes both files in one run (a pattern rule with two targets).
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: cache/%.proto
	@mkdir -p $(dir $@)
	$(call say,PROTOC,$<)$(PROTOC_C) --proto_path=cache --c_out=$(dir $@) $<
# Generated code: the same warnings, but never fatal (a newer protoc-c's
# output is not ours to fix).
# The commit a binary is built from, for kwc_build_info: rewritten only when
# it changes, so a build does not go stale nor rebuild for nothing.
KWC_COMMIT := $(or $(shell git rev-parse --short=12 HEAD 2>/dev/null),unknown)
$(BUILD)/gen/kwc_build.h: FORCE
	@mkdir -p $(dir $@)
	@printf '#define KWC_GIT_COMMIT "%s"\n' '$(KWC_COMMIT)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/proxy/ops/collect.o: $(BUILD)/gen/kwc_build.h
FORCE:

$(GEN_OBJ): $(GEN_C)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) -Wno-error -c -o $@ $<
$(BUILD)/cache/pb.o: $(GEN_H)

$(BUILD)/tests/unit/%: tests/unit/%.c $(BUILD)/libkwc.a tests/unit/tap.h
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(BUILD)/libkwc.a $(LIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libkwc.a
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libkwc.a $(LIBS)

unit: $(UNIT_BIN)
	$(Q)tests/lib/run-unit.sh $(UNIT_BIN)

# IT_JOBS: modules run that many at a time (tests/integration/run.py);
# make test runs two.
IT_JOBS ?= 1
export KWC_IT_JOBS = $(IT_JOBS)

integration: $(BUILD)/kwc
	$(Q)KWC_BIN=$(abspath $(BUILD)/kwc) PYTHON=$(PYTHON) $(PYTHON) tests/integration/run.py $(IT)

# The same suite with kwc serving TLS (test certificates from tests/lib/certs.py)
# and every client on https; tests marked only_in_plaintext_run are left out.
integration-tls: $(BUILD)/kwc
	$(Q)KWC_TLS=1 KWC_BIN=$(abspath $(BUILD)/kwc) PYTHON=$(PYTHON) $(PYTHON) tests/integration/run.py $(IT)

# The same suite with the tests speaking HTTP/2 to kwc (plaintext, prior
# knowledge; tests/lib/h2client.py) and HTTP/1.1 to apisim; tests marked
# only_over_http1 are left out. make test runs the list/get and watch
# modules ($(IT_H2)); KWC_TLS=1 as well gives HTTP/2 over TLS (ALPN h2).
IT_H2 ?= 10_ 11_ 20_
integration-h2: $(BUILD)/kwc
	$(Q)KWC_H2=1 KWC_BIN=$(abspath $(BUILD)/kwc) PYTHON=$(PYTHON) $(PYTHON) tests/integration/run.py $(IT)

# The tests that tear connections down mid-stream, against the ASan+UBSan kwc
# (LeakSanitizer runs at kwc's exit; the tests require exit status 0) and
# under valgrind.
IT_SAN ?= 01_ 05_ 06_ 08_ 10_ 11_ 13_ 14_ 15_ 16_ 17_ 19_ 22_ 23_ 25_ 29_ 30_ 31_ 32_ 33_ 34_ 36_
IT_SAN_TLS ?= 05_ 08_ 11_
IT_VALGRIND ?= 05_
integration-checked:
	$(Q)$(MAKE) --no-print-directory SAN=address,undefined build/san/kwc
	$(Q)KWC_SANITIZED=1 KWC_BIN=$(abspath build/san/kwc) PYTHON=$(PYTHON) $(PYTHON) tests/integration/run.py $(IT_SAN)
	$(Q)KWC_TLS=1 KWC_SANITIZED=1 KWC_BIN=$(abspath build/san/kwc) PYTHON=$(PYTHON) $(PYTHON) tests/integration/run.py $(IT_SAN_TLS)
	$(Q)KWC_BIN=$(abspath build/kwc) PYTHON=$(PYTHON) \
	  KWC_WRAP="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite" \
	  KWC_EXTRA_ARGS="--cache-map-size 1Gi" \
	  $(PYTHON) tests/integration/run.py $(IT_VALGRIND)

# ThreadSanitizer (issue 32): kwc built with -fsanitize=thread in build/tsan,
# the unit tests that start threads (TSAN_UNIT) and the integration modules
# where threads meet (watch workers fed by the
# main loop, their counters scraped by /metrics, streams ended by a drain or
# a shutdown, log lines from every thread) run against it: IT_TSAN
# plaintext, IT_TSAN_TLS with kwc serving TLS (TLS streams handed to a
# worker). A race makes kwc exit 66 (TSan's exitcode), which fails the test
# that stopped it; every report also lands in build/tsan/reports/, printed
# deduplicated at the end (tests/lib/tsan-summary.py). tests/tsan.supp: what
# is suppressed, each entry with its reason. Not in make test yet; its time
# is in docs/testing.md.
IT_TSAN ?= 05_ 11_ 17_ 22_ 25_ 27_ 34_
# the unit tests that start threads of their own, first
TSAN_UNIT ?= auth_loops_test catalog_test hstream_test mailbox_test metrics_test upthreads_test
IT_TSAN_TLS ?= 05_ 22_
TSAN_REPORTS := $(abspath build/tsan/reports)
TSAN_ENV = TSAN_OPTIONS="exitcode=66 halt_on_error=0 second_deadlock_stack=1 log_path=$(TSAN_REPORTS)/tsan \
  suppressions=$(abspath tests/tsan.supp)" KWC_SANITIZED=1 KWC_BIN=$(abspath build/tsan/kwc) PYTHON=$(PYTHON)
tsan:
	$(Q)$(MAKE) --no-print-directory SAN=thread BUILD=build/tsan build/tsan/kwc \
	  $(patsubst %,build/tsan/tests/unit/%,$(TSAN_UNIT))
	$(Q)rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	$(Q)TSAN_OPTIONS="exitcode=66 halt_on_error=0 suppressions=$(abspath tests/tsan.supp)" \
	  tests/lib/run-unit.sh $(patsubst %,build/tsan/tests/unit/%,$(TSAN_UNIT))
	$(Q)$(TSAN_ENV) $(PYTHON) tests/integration/run.py $(IT_TSAN); rc=$$?; \
	  $(TSAN_ENV) KWC_TLS=1 $(PYTHON) tests/integration/run.py $(IT_TSAN_TLS) || rc=1; \
	  $(PYTHON) tests/lib/tsan-summary.py $(TSAN_REPORTS) || rc=1; exit $$rc

# The CI command: everything, from a fresh machine.
test:
	$(Q)tests/lib/deps.sh test
	$(Q)$(MAKE) --no-print-directory check-layering
	$(Q)$(MAKE) --no-print-directory check-format
	$(Q)$(MAKE) --no-print-directory check-docs
	$(Q)$(MAKE) --no-print-directory all unit
	$(Q)$(MAKE) --no-print-directory SAN=address,undefined unit
	$(Q)$(MAKE) --no-print-directory fuzz-smoke
	$(Q)$(PYTHON) tests/apisim/test_apisim.py
	$(Q)$(MAKE) --no-print-directory image-test
	$(Q)$(MAKE) --no-print-directory IT_JOBS=2 integration
	$(Q)$(MAKE) --no-print-directory IT_JOBS=2 integration-tls
	$(Q)$(MAKE) --no-print-directory IT_JOBS=2 integration-h2 IT="$(IT_H2)"
	$(Q)$(MAKE) --no-print-directory IT_JOBS=2 integration-checked

run:
	$(Q)tests/lib/deps.sh build
	$(Q)$(MAKE) --no-print-directory all
	$(Q)$(PYTHON) tests/lib/demo.py --kwc $(BUILD)/kwc

# the etcd side of the fan-out bench speaks gRPC over HTTP/2 (libnghttp2);
# fanout --tls, tlsprobe and tlsrecord call OpenSSL themselves
$(BUILD)/bench/fanout: LIBS += -lnghttp2
$(BUILD)/bench/fanout $(BUILD)/bench/tlsprobe $(BUILD)/bench/tlsrecord: LIBS += -lssl -lcrypto

bench:
	$(Q)tests/lib/deps.sh bench
	$(Q)$(MAKE) --no-print-directory all $(BENCH_BIN)
	$(Q)$(PYTHON) bench/run.py --kwc $(BUILD)/kwc --bin $(BUILD)/bench $(BENCH_ARGS)

asan:
	$(Q)$(MAKE) --no-print-directory SAN=address,undefined all unit

fuzz:
	$(Q)$(MAKE) --no-print-directory -f tests/fuzz/Makefile

fuzz-smoke:
	$(Q)$(MAKE) --no-print-directory -f tests/fuzz/Makefile smoke

# The rooms (cache/, proxy/http, identity, upstream, serve, ops, and proxy/'s
# top) and what each may include: tests/lib/layering.py holds the rules. cache/
# is pure: no event loop, sockets, curl or clock; its only I/O is the data
# file (LMDB in store.c, dbcheck.c's pread of data.mdb).
check-layering:
	$(Q)$(PYTHON) tests/lib/layering.py

# Every C file as Debian's clang-format-14 writes it under .clang-format
# (tests/lib/check-format.sh; CLANG_FORMAT=... names another clang-format 14).
check-format:
	$(Q)tests/lib/check-format.sh check
format:
	$(Q)tests/lib/check-format.sh fix

# The docs stay true (issue 33): every flag of kwc --help in
# docs/configuration.md under its group, every metric family kwc exports
# (a scrape of kwc against apisim, and the source's names) in
# docs/operations.md's table, every relative link and #anchor of every *.md
# resolving inside the repository, nothing referring outside it. The
# checker's own unit test runs first. About a second.
check-docs: $(BUILD)/kwc
	$(Q)$(PYTHON) tests/lib/checkdocs_test.py
	$(Q)$(PYTHON) tests/lib/checkdocs.py --kwc $(BUILD)/kwc

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
