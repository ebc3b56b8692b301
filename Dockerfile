# The three mergestream binaries in one image; compose.yaml runs each as its own service.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl-dev zlib1g-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --bin storage-node --bin coordinator --bin ingestor

FROM debian:12.12-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/storage-node /src/target/release/coordinator /src/target/release/ingestor \
    /usr/local/bin/
COPY pipelines /pipelines
COPY schemas/avro /schemas/avro
