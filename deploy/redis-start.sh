#!/bin/sh
# How compose.yaml starts each of its Redis servers (installed in the streamq-redis image
# as streamq-redis-start by deploy/redis.Dockerfile):
#
#     streamq-redis-start redis-server CONFIG [OPTION...]
#
# 1. It refuses to start while a secret mounted in the container (/run/secrets/*) is one
#    of the examples committed in deploy/secrets/ (they hold the marker CHANGE-ME-example):
#    one line on stderr naming the file, exit 1. Nothing that depends on Redis starts then.
# 2. With STREAMQ_MASTERAUTH_FILE (a cluster node: /run/secrets/admin-password) it hands
#    redis-server that password as `masterauth` on its standard input (redis-server's
#    trailing `-` argument): replicas authenticate to their masters as the admin with the
#    admin's secret as it is when the node starts; no password is written in a
#    configuration file or shown on a command line.
# 3. It runs redis-server through the image's docker-entrypoint.sh (which drops root for
#    the redis user), or directly where there is none (tests/test_compose.py runs this
#    script as a local process).
set -eu

secrets_dir=${STREAMQ_SECRETS_MOUNT:-/run/secrets}
marker=CHANGE-ME-example

fail() {
    echo "streamq-redis-start: $*" >&2
    exit 1
}

[ "$#" -ge 1 ] || fail "usage: streamq-redis-start redis-server CONFIG [OPTION...]"

for f in "$secrets_dir"/*; do
    [ -f "$f" ] || continue
    [ -r "$f" ] || fail "cannot read the secret $f"
    if grep -q -e "$marker" "$f"; then
        fail "$f is an example secret ($marker...), not a real one: write fresh secrets with \`streamq setup --acl DIR\` and start compose with STREAMQ_SECRETS_DIR=DIR (docs/operations.md, Deployment)"
    fi
done

if command -v docker-entrypoint.sh >/dev/null 2>&1; then
    set -- docker-entrypoint.sh "$@"
fi

if [ -n "${STREAMQ_MASTERAUTH_FILE:-}" ]; then
    [ -r "$STREAMQ_MASTERAUTH_FILE" ] || fail "cannot read STREAMQ_MASTERAUTH_FILE $STREAMQ_MASTERAUTH_FILE"
    auth=$(tr -d '\r\n' < "$STREAMQ_MASTERAUTH_FILE")
    [ -n "$auth" ] || fail "STREAMQ_MASTERAUTH_FILE $STREAMQ_MASTERAUTH_FILE is empty"
    # a redis.conf string: backslashes and double quotes escaped
    auth=$(printf '%s' "$auth" | sed 's/[\\"]/\\&/g')
    exec "$@" - <<EOF
masterauth "$auth"
EOF
fi
exec "$@"
