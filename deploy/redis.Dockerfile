# Redis with streamq's module (module/streamq_module.c: SQ.FCALL, under which the
# roles of deploy/users.acl hold no write command of their own). compose.yaml
# builds it for its Redis services; deploy/redis.conf loads the module.
FROM redis:7.2-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY module/streamq_module.c /src/streamq_module.c
RUN gcc -O2 -Wall -Wextra -std=c99 -fPIC -shared -o /src/streamq-module.so /src/streamq_module.c

FROM redis:7.2-bookworm
COPY --from=build /src/streamq-module.so /usr/local/lib/redis/streamq-module.so
