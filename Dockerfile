# syntax=docker/dockerfile:1
#
# cdcrelay container image.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t cdcrelay:dev .
#   docker run --rm -e CDCRELAY_DATABASE_URL=... -e CDCRELAY_AMQP_URL=... cdcrelay:dev
#
# The build stage runs on the builder's own platform and cross-compiles for the
# target one (docker buildx build --platform linux/amd64,linux/arm64 ...).
#
# Without a container daemon or access to base images, `make image` builds the
# equivalent image as an OCI archive with the Go toolchain alone
# (tools/image; deploy/helm/README.md says how to push it).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src

# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
# The version `cdcrelay version` prints and cdcrelay_build_info reports.
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /cdcrelay ./cmd/cdcrelay

# distroless/static: CA certificates and tzdata, no shell, runs as uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=""
LABEL org.opencontainers.image.title="cdcrelay" \
      org.opencontainers.image.description="Streams outbox-table INSERTs from PostgreSQL logical replication to RabbitMQ" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/cdcrelay/cdcrelay"
COPY --from=build /cdcrelay /cdcrelay
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/cdcrelay"]
CMD ["run"]
