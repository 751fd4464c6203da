# Redis with streamq's module (module/streamq_module.c: SQ.FCALL, under which the
# roles of the users ACL hold no write command of their own). compose.yaml
# builds it for its Redis services; deploy/redis.conf loads the module. The module
# is built on the same Debian release as the Redis image (bookworm).
#
# Both images are pinned by the digest of their multi-platform index, as
# docker-library/repo-info lists it for the tag kept before the @ (repos/<image>/remote/<tag>.md):
# gcc:12-bookworm (gcc 12.5.0), redis:7.2-bookworm (Redis 7.2.16; the same digest is
# pinned for redis:7.2.16 and redis:7.2-bookworm in other public repositories).
# Refresh: docker buildx imagetools inspect gcc:12-bookworm (and redis:7.2-bookworm).
FROM gcc:12-bookworm@sha256:55cfb979458f12159f8f0985e3c66d890bf2f2c350cdb6ced390e0de00ffe065 AS build
COPY module/streamq_module.c /src/streamq_module.c
RUN gcc -O2 -Wall -Wextra -std=c99 -fPIC -shared -o /src/streamq-module.so /src/streamq_module.c

FROM redis:7.2-bookworm@sha256:74566c6910d13ae61e7ce73ebd3127438a1fe805b309b097c323142719ec8a5b
COPY --from=build /src/streamq-module.so /usr/local/lib/redis/streamq-module.so
# compose.yaml starts every Redis through it: it refuses the example secrets of
# deploy/secrets/, and gives a cluster node its masterauth from the admin's secret
COPY --chmod=755 deploy/redis-start.sh /usr/local/bin/streamq-redis-start
