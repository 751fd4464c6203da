# streamq worker / reaper / web dashboard image: `streamq` is the entry point.
# The base image pinned by digest (python:3.11-slim-bookworm, linux/amd64 and arm64): a
# rebuild gets the same base. Refresh: docker buildx imagetools inspect python:3.11-slim-bookworm
FROM python:3.11-slim-bookworm@sha256:b18992999dbe963a45a8a4da40ac2b1975be1a776d939d098c647482bcad5cba

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY streamq ./streamq
COPY lua ./lua
RUN pip install --constraint constraints.txt ".[web]" \
 && groupadd --system --gid 10001 streamq \
 && useradd --system --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin streamq

# the non-root user created above
USER 10001:10001
ENTRYPOINT ["streamq"]
CMD ["--help"]
