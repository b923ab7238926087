# kwc's container image: built with the project's Makefile in a Debian
# bookworm stage, run as a non-root user in bookworm-slim with only the
# shared libraries kwc links (`ldd build/kwc`; tests/integration/21_deploy.py
# checks this list against the binary and every flag below against
# `kwc --help`).
#
#   make image                      # podman build (CONTAINER=buildah|docker also work)
#   make image IMAGE=registry.example/kwc:1.0
#
# The build stage installs the build packages with the same script
# `make deps` uses (tests/lib/deps.sh build), so the list lives in one place.
# Build and run stages must be the same Debian release: the runtime
# packages below are the bookworm ones the build linked against.
ARG DEBIAN_IMAGE=docker.io/library/debian

FROM ${DEBIAN_IMAGE}:bookworm AS build
WORKDIR /src
COPY tests/lib/deps.sh tests/lib/deps.sh
RUN tests/lib/deps.sh build && rm -rf /var/lib/apt/lists/*
COPY . .
# WERROR=0 as for packagers: warnings are CI's business, not the image's.
RUN make -j"$(nproc)" WERROR=0 build/kwc \
 && install -D -m 0755 -s build/kwc /out/kwc

FROM ${DEBIAN_IMAGE}:bookworm-slim
# One package per library kwc links (DT_NEEDED; their dependencies come
# with them), plus ca-certificates: a kubeconfig without a CA (or an
# in-cluster mount without ca.crt) verifies the upstream against the system
# roots, as client-go does.
#   libcurl4 libcurl.so.4 (the OpenSSL flavour: kwc builds with libcurl4-openssl-dev)
#   libevent-2.1-7 libevent-2.1.so.7      libevent-openssl-2.1-7 libevent_openssl-2.1.so.7
#   libhttp-parser2.9 libhttp_parser.so.2.9   libjansson4 libjansson.so.4
#   liblmdb0 liblmdb.so.0                 libprotobuf-c1 libprotobuf-c.so.1
#   libssl3 libssl.so.3, libcrypto.so.3   libyaml-0-2 libyaml-0.so.2
#   zlib1g libz.so.1
#   (libc6 is in the base image)
# A uid, not a name: Kubernetes' runAsNonRoot can only verify a numeric USER.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates \
      libcurl4 \
      libevent-2.1-7 \
      libevent-openssl-2.1-7 \
      libhttp-parser2.9 \
      libjansson4 \
      liblmdb0 \
      libprotobuf-c1 \
      libssl3 \
      libyaml-0-2 \
      zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 kwc \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/kwc --no-create-home --no-log-init \
      --shell /usr/sbin/nologin kwc \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/kwc
COPY --from=build /out/kwc /usr/local/bin/kwc
# Apache-2.0 asks that whoever receives the work gets a copy of the license.
COPY LICENSE /usr/share/doc/kwc/LICENSE
# OCI annotations (tests/integration/21_deploy.py checks the license).
LABEL org.opencontainers.image.title="kwc" \
      org.opencontainers.image.description="A watch-cache reverse proxy for the Kubernetes API: answers list and watch traffic from per-resource LMDB caches" \
      org.opencontainers.image.licenses="Apache-2.0"
# Fails the build if a library is missing from the list above.
RUN ["/usr/local/bin/kwc", "--version"]
USER 10001:10001
# The LMDB cache. In Kubernetes: a PersistentVolumeClaim (conf/kubernetes/).
VOLUME ["/var/lib/kwc"]
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/kwc"]
# Defaults for `podman run -v ...:/var/lib/kwc -v tls:/etc/kwc/tls ...`:
# HTTPS on every address with the serving certificate from /etc/kwc/tls
# (delegated authentication and authorization, the default with TLS) and,
# without --kubeconfig/--upstream, the in-cluster service account. The
# Kubernetes manifests give their own args.
CMD ["--listen", "0.0.0.0:8443", "--data-dir", "/var/lib/kwc", \
     "--tls-cert-file", "/etc/kwc/tls/tls.crt", "--tls-private-key-file", "/etc/kwc/tls/tls.key"]
