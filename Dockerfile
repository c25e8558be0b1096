FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY lavinpy ./lavinpy
COPY conf ./conf
RUN pip install --no-cache-dir .
VOLUME ["/var/lib/lavinpy"]
ENV LAVINPY_DATA_DIR=/var/lib/lavinpy \
    LAVINPY_BIND=0.0.0.0
EXPOSE 5672 5671 15672
CMD ["lavinpy", "--config", "/app/conf/lavinpy.yaml"]
