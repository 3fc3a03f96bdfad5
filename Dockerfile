# The relay image: a static binary on distroless, running as a non-root user.
#   docker build --build-arg VERSION=0.1.0 -t code.foss.global/serve.zone/relay:0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/relay ./cmd/relay \
 && /out/relay version  # fails the build unless VERSION is MAJOR.MINOR.PATCH (no leading v)

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/relay /relay
USER 65532:65532
EXPOSE 8443/tcp 51820/udp 9464/tcp
ENTRYPOINT ["/relay"]
CMD ["run"]
