# syntax=docker/dockerfile:1
# Images of the flash-sale platform, from one multi-stage file (docs/images.md):
#   docker build --target runtime  -t flashsale-runtime:0.1.0 .
#   docker build --target operator -t flashsale-operator:0.1.0 .
# Both run as the non-root user 1000 from a read-only filesystem: the application files belong to
# root and are not writable. Layout of /app: package.json, node_modules/ (production dependencies
# only), dist/ (compiled TypeScript), lua/ (Redis scripts, found by walking up from dist/core),
# and for the runtime runtime/api/openapi.yaml (served at /openapi.yaml).
# Node 24 LTS, pinned to a release (the same one test/env/lib.sh installs for the tests, demo and
# benchmarks). Pin the digest at release time (docs/images.md, "Base image"):
#   docker build --build-arg NODE_IMAGE=node:24.22.3-bookworm-slim@sha256:<digest> ...
ARG NODE_IMAGE=node:24.22.3-bookworm-slim
# The final images' base: the Debian release the Node image is built on, without Node and its
# package managers. Only the node binary is copied in (stage `node`), so npm, npx, corepack and
# yarn are not in any layer of the final images (docs/images.md, "What the images hold").
ARG BASE_IMAGE=debian:bookworm-slim

# ---- node: the Node image, only for its node binary
FROM ${NODE_IMAGE} AS node

# ---- build: all dependencies, compile TypeScript to dist/
FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
COPY patches patches
# Install scripts stay off; the one the project needs is its own: patch-package applies patches/
# (fixes to kafkajs and ioredis that upstream has not released, docs/images.md "Patched dependencies").
RUN --mount=type=cache,target=/root/.npm npm ci --no-audit --no-fund --ignore-scripts \
 && npx patch-package --error-on-fail
COPY tsconfig.json tsconfig.build.json ./
COPY core core
COPY runtime runtime
COPY operator operator
# Without source maps: the images run compiled JavaScript only (stack traces name dist/ files).
RUN npm run build -- --sourceMap false

# ---- prod-deps: production dependencies only (no TypeScript, jest, eslint)
FROM ${NODE_IMAGE} AS prod-deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN --mount=type=cache,target=/root/.npm npm ci --omit=dev --no-audit --no-fund --ignore-scripts
# patch-package is a development dependency: the patched packages come from the build stage.
COPY --from=build /src/node_modules/kafkajs node_modules/kafkajs
COPY --from=build /src/node_modules/ioredis node_modules/ioredis

# ---- base: what both images share: Debian slim, the node binary, the application
FROM ${BASE_IMAGE} AS base
ARG VERSION=0.1.0
COPY --from=node /usr/local/bin/node /usr/local/bin/node
ENV NODE_ENV=production
WORKDIR /app
COPY package.json ./
COPY --from=prod-deps /app/node_modules node_modules
COPY --from=build /src/dist dist
COPY lua lua
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/flashsale/flashsale"
# A numeric user (the Node image's "node" uid), so that runAsNonRoot can verify it; no account
# is needed: the programs read nothing from a home directory.
USER 1000:1000

# ---- runtime: api | relay | consumer | jobs | all (the operator sets the role as the argument)
FROM base AS runtime
COPY runtime/api/openapi.yaml runtime/api/openapi.yaml
# Node 24 sizes V8's young generation from the heap limit: up to 2 × 64 MB semi-spaces on a large
# host, which an api under load fills before every scavenge (peak RSS 2.3× idle in
# docs/benchmarks.md). 8 MB semi-spaces remove about two thirds of that growth for a few more,
# cheap, scavenges. glibc gives each thread that allocates (V8's GC helpers, libuv's pool) a
# malloc arena of its own, and freed memory stays in them: two arenas took 2-34 MB off the api's
# peak at the same CPU per request (bench/ab.ts and the bench's own phases, bench/analysis.md).
# bench/run.ts starts the roles and the floors with these same settings. The relay and the
# consumer get larger semi-spaces on their command line from the operator (core/young-generation.ts).
ENV NODE_OPTIONS="--max-semi-space-size=8"
ENV MALLOC_ARENA_MAX=2
LABEL org.opencontainers.image.title="flashsale-runtime" \
      org.opencontainers.image.description="Flash-sale order runtime: api, relay, consumer and jobs roles"
EXPOSE 8080 9090
CMD ["node", "dist/runtime/main.js", "all"]

# ---- operator: the FlashSaleActivity operator (the last stage, so a plain `docker build` builds it)
FROM base AS operator
LABEL org.opencontainers.image.title="flashsale-operator" \
      org.opencontainers.image.description="Operator driving FlashSaleActivity resources through their lifecycle"
EXPOSE 8081
CMD ["node", "dist/operator/main.js"]
