# syntax=docker/dockerfile:1
#
# The facilitator images, one per audience (like the two binaries):
#   serve (the default target)  the production binary alone on a distroless base: no shell, no
#                                Node, no anvil. `facilitator serve` against real chains (configure
#                                with FACILITATOR_* and DATABASE_URL); `facilitator migrate`.
#   dev (--target dev)           the local stack: `facilitator-dev dev` starts anvil, deploys
#                                Circle's USDC and serves with the production binary beside it.
# `dev` needs anvil and the compiled USDC artifacts, which come from the pinned npm packages
# (package.json / package-lock.json), so its stage is a Node image with `npm ci` in /app;
# devchain finds /app/node_modules by walking up from the working directory.
#
# anvil's npm package (@foundry-rs/anvil-linux-amd64) exists for linux/amd64 only, so the dev
# stage is pinned to that platform (it runs under emulation on arm64 hosts) and the binaries are
# cross-compiled for it. go-ethereum builds without cgo, so the binaries are static.

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0 GOOS=linux GOARCH=amd64
RUN go build -trimpath -ldflags="-s -w" -o /out/facilitator ./cmd/facilitator \
 && go build -trimpath -ldflags="-s -w" -o /out/facilitator-dev ./cmd/facilitator-dev

FROM --platform=linux/amd64 node:20-bookworm-slim AS dev
WORKDIR /app
COPY package.json package-lock.json ./
# Install scripts are not run. Of the packages --omit=dev installs, two have one: bufferutil and
# utf-8-validate, ws's optional native speed-ups, which ship prebuilt (their script only builds
# where no prebuild fits) and without which ws runs in plain JS. node_modules stays root-owned:
# the node user only reads it (devchain's scratch files go to /tmp).
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
 && npm cache clean --force
# The slim image has no system CA bundle; Go needs one for https RPC endpoints.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# facilitator-dev serves with the production binary it finds beside it.
COPY --from=build /out/facilitator /out/facilitator-dev /usr/local/bin/
USER node
EXPOSE 4021 8545
ENTRYPOINT ["/usr/local/bin/facilitator-dev"]
CMD ["dev", "--listen", "0.0.0.0:4021", "--anvil-host", "0.0.0.0"]

# The serve image: static binary, CA certificates and a non-root user, nothing else.
FROM gcr.io/distroless/static-debian12:nonroot AS serve
COPY --from=build /out/facilitator /usr/local/bin/facilitator
# serve's default (127.0.0.1) is unreachable from outside a container.
ENV FACILITATOR_LISTEN=0.0.0.0:4021
USER nonroot
EXPOSE 4021
# The image has no curl: the binary asks its own /healthz on FACILITATOR_LISTEN's port.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/facilitator", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/facilitator"]
CMD ["serve"]
