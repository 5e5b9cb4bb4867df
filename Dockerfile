# kvmesh node image: a static binary (CGO_ENABLED=0) on distroless, run as
# a non-root user, with the data dir (the NVMe tier) as a volume.
#
# deploy/release.sh builds it for linux/amd64 and linux/arm64 with the
# release's version (the VERSION file) and revision stamped. By hand:
#
#   docker build --build-arg VERSION=$(cat VERSION) --build-arg REVISION=$(git rev-parse HEAD) -t kvmesh:$(cat VERSION) .
#   docker run -p 7600-7603:7600-7603 -p 7603:7603/udp -v kvmesh-data:/var/lib/kvmesh kvmesh:$(cat VERSION)
#
# The CUDA prefill engine needs cgo and is not in this image (see docs/GPU.md).

# The build stage runs on the builder's platform and cross-compiles for the
# target's (docker buildx --platform linux/amd64,linux/arm64).
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux TARGETARCH
# The version (kvmesh version, Members) and VCS revision (kvmesh_build_info)
# stamped into the binary: the build context has no .git. The flags are
# deploy/release.sh's, so that the image's binary is the release's.
ARG VERSION="" REVISION=unknown
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.releaseVersion=${VERSION} -X github.com/kvmesh/kvmesh/node.revision=${REVISION}" \
      -o /out/kvmesh ./cmd/kvmesh \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvmesh /usr/local/bin/kvmesh
COPY --from=build /src/LICENSE /usr/share/doc/kvmesh/LICENSE
# distroless's nonroot user (65532) owns the data dir.
COPY --from=build --chown=65532:65532 /out/data /var/lib/kvmesh
USER 65532:65532
# Every listener on all interfaces; KVMESH_ADVERTISE_HOST (the pod or host
# IP) tells the other members where to reach this one.
ENV KVMESH_DATA_DIR=/var/lib/kvmesh \
    KVMESH_GRPC_ADDR=0.0.0.0:7600 \
    KVMESH_HTTP_ADDR=0.0.0.0:7601 \
    KVMESH_DATA_ADDR=0.0.0.0:7602 \
    KVMESH_GOSSIP_ADDR=0.0.0.0:7603
VOLUME ["/var/lib/kvmesh"]
# gRPC API, HTTP (/metrics, /livez, /readyz), data plane, gossip (TCP and UDP).
EXPOSE 7600/tcp 7601/tcp 7602/tcp 7603/tcp 7603/udp
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/kvmesh", "health", "--addr", "127.0.0.1:7600"]
# SIGTERM stops the node gracefully (requests, hand-off and leave, DRAM
# written to NVMe: each within --shutdown-timeout, default 8s); give it three
# of them and more: docker stop -t 30.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvmesh"]
CMD ["serve"]
