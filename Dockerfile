# syntax=docker/dockerfile:1
#
# The facilitator image. One image serves both uses:
#   facilitator serve   production API against real chains (configure with FACILITATOR_* and DATABASE_URL)
#   facilitator dev     local stack: starts anvil, deploys Circle's USDC, then serves
# `dev` needs anvil and the compiled USDC artifacts, which come from the pinned npm packages
# (package.json / package-lock.json), so the runtime stage is a Node image with `npm ci` in /app;
# devchain finds /app/node_modules by walking up from the working directory.
#
# anvil's npm package (@foundry-rs/anvil-linux-amd64) exists for linux/amd64 only, so the runtime
# stage is pinned to that platform (it runs under emulation on arm64 hosts) and the binary is
# cross-compiled for it. go-ethereum builds without cgo, so the binary is static.

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0 GOOS=linux GOARCH=amd64
RUN go build -trimpath -ldflags="-s -w" -o /out/facilitator ./cmd/facilitator

FROM --platform=linux/amd64 node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
# No production package in the lockfile has an install script, so none is run. node_modules stays
# root-owned: the node user only reads it (devchain's scratch files go to /tmp).
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
 && npm cache clean --force
# The slim image has no system CA bundle; Go needs one for https RPC endpoints under `serve`.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/facilitator /usr/local/bin/facilitator
# serve's default (127.0.0.1) is unreachable from outside a container.
ENV FACILITATOR_LISTEN=0.0.0.0:4021
USER node
EXPOSE 4021 8545
ENTRYPOINT ["/usr/local/bin/facilitator"]
CMD ["serve"]
