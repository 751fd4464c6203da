# streamq worker / reaper image: `streamq` is the entry point.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY streamq ./streamq
COPY lua ./lua
RUN pip install . \
 && groupadd --system --gid 10001 streamq \
 && useradd --system --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin streamq

# the non-root user created above
USER 10001:10001
ENTRYPOINT ["streamq"]
CMD ["--help"]
