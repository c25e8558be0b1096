FROM python:3.12-slim

# The broker runs as this user, never as root; its data lives in the volume below.
RUN useradd --system --uid 999 --user-group --home-dir /var/lib/lavinpy --no-create-home lavinpy \
    && mkdir -p /var/lib/lavinpy && chown lavinpy:lavinpy /var/lib/lavinpy && chmod 700 /var/lib/lavinpy

WORKDIR /app

# Dependencies first, from pyproject.toml alone: a code change does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt

COPY README.md ./
COPY lavinpy ./lavinpy
COPY conf ./conf
RUN pip install --no-cache-dir --no-deps .

VOLUME ["/var/lib/lavinpy"]

# First start only: the user created in an empty data dir (administrator, full rights on "/").
# "guest" may log in from loopback only, so set your own for clients outside the container:
#   docker run -e LAVINPY_DEFAULT_USER=admin -e LAVINPY_DEFAULT_PASSWORD=s3cret ...
# Later changes are made with lavinpyctl or the management API; these two are then ignored.
ENV LAVINPY_DATA_DIR=/var/lib/lavinpy \
    LAVINPY_BIND=0.0.0.0 \
    LAVINPY_DEFAULT_USER=guest \
    LAVINPY_DEFAULT_PASSWORD=guest

# AMQP, AMQPS (when tls_cert is set), management API and dashboard, Prometheus metrics.
EXPOSE 5672 5671 15672 15692

USER lavinpy

# Healthy while the management API answers (an alarm is shown, not a failure). LAVINPYCTL_URI
# overrides the credentials (set it if the first-start password was changed since).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD lavinpyctl --uri "${LAVINPYCTL_URI:-http://${LAVINPY_DEFAULT_USER}:${LAVINPY_DEFAULT_PASSWORD}@127.0.0.1:15672}" \
        status >/dev/null || exit 1

CMD ["lavinpy", "--config", "/app/conf/lavinpy.yaml"]
