# syntax=docker/dockerfile:1
# hypd's management container: the release binary and the console bundle on a slim
# Debian, running as a non-root user. Every tool version is pinned so the same commit
# builds the same image.

ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-20261110-slim

FROM ${RUST_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# binaryen from npm provides the wasm-opt console-build runs on the release bundle.
# (Debian's binaryen 108 breaks the split bundle: it points the externref table's export
# at the function table.)
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs=18.20.4+dfsg-1~deb12u3 npm=9.2.0~ds1-1 \
    && rm -rf /var/lib/apt/lists/* \
    && npm install --global --no-audit --no-fund binaryen@132.0.0
RUN rustup target add wasm32-unknown-unknown
WORKDIR /src
COPY . .
ENV CARGO_TARGET_DIR=/src/target
# console-build (a crate of the workspace, wasm-bindgen pinned by Cargo.lock) builds the
# split console bundle into target/site and the release server.
RUN cargo run -q -p console-build -- --release \
    && mkdir -p /out \
    && cp target/release/hypd /out/hypd \
    && cp -r target/site /out/site

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates=20250419~deb12u2 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/hypd --create-home hypd
# The console bundle sits beside the binary, where hypd looks for it by default.
COPY --from=build /out/hypd /usr/local/bin/hypd
COPY --from=build /out/site /usr/local/bin/site
USER 10001:10001
ENV HYPD_BIND=0.0.0.0 \
    HYPD_PORT=3099 \
    HYPD_DATA_DIR=/var/lib/hypd \
    HYPD_LOG_FORMAT=json
VOLUME ["/var/lib/hypd"]
EXPOSE 3099
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 CMD ["/usr/local/bin/hypd", "health"]
ENTRYPOINT ["/usr/local/bin/hypd"]
CMD ["serve"]
