# The relay image: a static binary on distroless, running as a non-root user.
#   docker build --build-arg VERSION=0.1.0 -t code.foss.global/serve.zone/relay:0.1.0 .
# Base images are pinned by digest (the tag says which line a digest is from): a rebuild of the
# same commit gets the same bases. Update both together, on purpose.
FROM golang:1.26@sha256:595c7847cff97c9a9e76f015083c481d26078f961c9c8dca3923132f51fe12f1 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/relay ./cmd/relay \
 && /out/relay version  # fails the build unless VERSION is MAJOR.MINOR.PATCH (no leading v)

FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
COPY --from=build /out/relay /relay
USER 65532:65532
EXPOSE 8443/tcp 51820/udp 9464/tcp
# The image has no shell or curl: `relay probe` GETs /healthz on the port SERVEZONE_RELAY_ADMIN_LISTEN
# (or the default 127.0.0.1:9464) names, exit 0 on 200. Kubernetes ignores HEALTHCHECK; the chart
# has its own probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["/relay", "probe"]
ENTRYPOINT ["/relay"]
CMD ["run"]
