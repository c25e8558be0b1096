# syntax=docker/dockerfile:1
# Two stages: a build stage with a C compiler makes the wheels (lavinpy's with its compiled extensions,
# and its dependencies'); the runtime image installs them and has no compiler. The extensions are
# optional in setup.py, so a build without a compiler would quietly give a pure-Python broker: the
# build stage refuses that below. BuildKit (Docker 23+'s default) is needed for RUN --mount.

FROM python:3.12-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Everything `pip wheel .` reads: metadata, setup.py (it declares the C extensions), the sources.
COPY pyproject.toml setup.py README.md ./
COPY lavinpy ./lavinpy
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
    && pip install --no-cache-dir --no-index --find-links /wheels lavinpy \
    && python -c "import lavinpy.wire._cwire, lavinpy.store._cstore"

FROM python:3.12-slim

# The broker runs as this user, never as root; its data lives in the volume below.
RUN useradd --system --uid 999 --user-group --home-dir /var/lib/lavinpy --no-create-home lavinpy \
    && mkdir -p /var/lib/lavinpy /etc/lavinpy && chown lavinpy:lavinpy /var/lib/lavinpy \
    && chmod 700 /var/lib/lavinpy

# Only wheels, no network and no compiler: the image runs exactly what the build stage checked.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels lavinpy \
    && python -c "import lavinpy.wire._cwire, lavinpy.store._cstore"

COPY lavinpy/lavinpy.yaml /etc/lavinpy/lavinpy.yaml
WORKDIR /var/lib/lavinpy
VOLUME ["/var/lib/lavinpy"]

# First start only: the user created in an empty data dir (administrator, full rights on "/").
# "guest" may log in from loopback only, so set your own for clients outside the container:
#   docker run -e LAVINPY_DEFAULT_USER=admin -e LAVINPY_DEFAULT_PASSWORD=s3cret ...
# Later changes are made with lavinpyctl or the management API; these two are then ignored.
ENV LAVINPY_DATA_DIR=/var/lib/lavinpy \
    LAVINPY_BIND=0.0.0.0 \
    LAVINPY_DEFAULT_USER=guest \
    LAVINPY_DEFAULT_PASSWORD=guest

# AMQP, AMQPS, the management API and dashboard over HTTPS and HTTP, Prometheus metrics over HTTP and
# HTTPS (the TLS ports listen once tls_cert is set).
EXPOSE 5672 5671 15671 15672 15692 15691 1883 8883

USER lavinpy

# Healthy while the management API answers (an alarm is shown, not a failure). LAVINPYCTL_URI
# overrides the credentials (set it if the first-start password was changed since).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD lavinpyctl --uri "${LAVINPYCTL_URI:-http://${LAVINPY_DEFAULT_USER}:${LAVINPY_DEFAULT_PASSWORD}@127.0.0.1:15672}" \
        status >/dev/null || exit 1

CMD ["lavinpy", "--config", "/etc/lavinpy/lavinpy.yaml"]
