# streamq worker / reaper / web dashboard image: `streamq` is the entry point.
#
# Everything it installs is pinned: the base image by digest, every Python package by
# version and sha256 (pip's --require-hashes mode refuses anything else).
# The base, python:3.11-slim-bookworm, is its multi-platform index (linux/amd64, arm64, ...):
# the digest docker-library/repo-info lists for that tag (3.11.15), also pinned for it in
# several public repositories. Refresh: docker buildx imagetools inspect python:3.11-slim-bookworm
# (or docker-library/repo-info, repos/python/remote/3.11-slim-bookworm.md), in both FROMs.
#
# Stage 1 builds streamq's wheel with its build backend (hatchling) installed from
# deploy/requirements-build.txt, hashes checked, instead of pip's unchecked build isolation.
FROM python:3.11-slim-bookworm@sha256:b18992999dbe963a45a8a4da40ac2b1975be1a776d939d098c647482bcad5cba AS build

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY deploy/requirements-build.txt ./
RUN pip install --require-hashes --requirement requirements-build.txt
COPY pyproject.toml README.md ./
COPY streamq ./streamq
COPY lua ./lua
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

# Stage 2: the runtime dependencies (and the web extra), each pinned with its hashes in
# deploy/requirements.txt (pip-compile --generate-hashes, from pyproject.toml and
# constraints.txt: its header has the command), then streamq's own wheel without deps.
FROM python:3.11-slim-bookworm@sha256:b18992999dbe963a45a8a4da40ac2b1975be1a776d939d098c647482bcad5cba

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY deploy/requirements.txt ./
RUN pip install --require-hashes --requirement requirements.txt
COPY --from=build /wheels /wheels
RUN pip install --no-deps /wheels/streamq-*.whl \
 && rm -rf /wheels \
 && groupadd --system --gid 10001 streamq \
 && useradd --system --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin streamq

# the non-root user created above
USER 10001:10001
ENTRYPOINT ["streamq"]
CMD ["--help"]
