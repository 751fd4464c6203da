# Redis with streamq's module (module/streamq_module.c: SQ.FCALL, under which the
# roles of deploy/users.acl hold no write command of their own). compose.yaml
# builds it for its Redis services; deploy/redis.conf loads the module. The module
# is built on the same Debian release as the Redis image (bookworm).
FROM gcc:12-bookworm AS build
COPY module/streamq_module.c /src/streamq_module.c
RUN gcc -O2 -Wall -Wextra -std=c99 -fPIC -shared -o /src/streamq-module.so /src/streamq_module.c

FROM redis:7.2-bookworm
COPY --from=build /src/streamq-module.so /usr/local/lib/redis/streamq-module.so
