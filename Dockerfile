# lease-sweeper container image: one static (musl) binary on an empty base.
#
# This multi-stage build needs a registry (it pulls rust:1.94-bookworm).
# Without one, scripts/container-image.sh builds the same final stage from a
# binary cargo builds on the host, and tests the image under Docker.
#
#   docker build -t lease-sweeper:0.1.0 .
#   docker run --rm -e LOCKDB_URL=postgres://... lease-sweeper:0.1.0
#   docker run --rm --entrypoint /lease-sweeper -e LOCKDB_URL=... lease-sweeper:0.1.0 check
#
# Why FROM scratch works: the binary is statically linked (musl), TLS roots
# are compiled in (rustls + webpki-roots, so no /etc/ssl), it runs as a
# numeric user (no /etc/passwd), writes no files (read-only root is fine) and
# needs no shell. DNS uses the /etc/resolv.conf the runtime mounts. The same
# build is proven outside a container by scripts/static-binary.sh.
# docs/container.md has the details; x86_64 only as written (see there for arm64).

# ---- build stage ------------------------------------------------------------
FROM rust:1.94-bookworm AS build
# musl-gcc builds ring's C and assembly for the musl target; protoc compiles
# etcd's protocol files for the etcd client.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools protobuf-compiler \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
# Only what the binary is built from (migrations/ and sql/ are embedded at
# compile time).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY migrations ./migrations
COPY sql ./sql
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin lease-sweeper \
 && cp target/x86_64-unknown-linux-musl/release/lease-sweeper /lease-sweeper \
 && /lease-sweeper --version

# ---- final stage: nothing but the binary -------------------------------------
FROM scratch
COPY --from=build /lease-sweeper /lease-sweeper
# 65532: the conventional "nonroot" uid/gid (distroless); no home, no shell.
USER 65532:65532
# Logs are logfmt on stdout; SIGTERM drains and exits 0 within ~7 s (as PID 1
# too: the daemon installs its own handlers, so no init shim is needed).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/lease-sweeper", "run"]
