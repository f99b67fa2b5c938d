# The coordinator: ballastd and the ballast CLI on Debian 12, without
# LibTorch. The build context is the staging folder that scripts/images
# (`make images`) fills from `make build`'s binaries; nothing compiles here.
#
#   podman run -d -p 50051:50051 -p 9090:9090 -e BALLAST_TOKEN=... \
#     -v ballast-store:/var/lib/ballast -v /srv/ballast:/srv/ballast localhost/ballast-coordinator
#
# The default command listens on every interface, which ballastd allows
# only with BALLAST_TOKEN set: without it, anyone who reaches the port could
# submit and read jobs, so it refuses to start and says so.
#
# Ports: 50051 gRPC (JobService, WorkerService, grpc.health.v1), 9090 HTTP
# (/metrics, /healthz). The SQLite store is on the /var/lib/ballast volume;
# job outputs go under /srv/ballast/outputs, the storage that every worker
# mounts at the same path (docs/deploy.md).
ARG BASE=docker.io/library/debian:12.11-slim
FROM ${BASE}

COPY lib/ /usr/local/lib/ballast/
COPY bin/ /usr/local/bin/
RUN echo /usr/local/lib/ballast > /etc/ld.so.conf.d/ballast.conf \
    && ldconfig \
    && useradd --no-log-init --uid 10001 --user-group --home-dir /var/lib/ballast --create-home ballast \
    && mkdir -p /srv/ballast \
    && chown ballast:ballast /srv/ballast

# The CLI's default coordinator, for the health check and `podman exec`.
ENV BALLAST_COORDINATOR=127.0.0.1:50051
USER 10001:10001
VOLUME ["/var/lib/ballast"]
EXPOSE 50051 9090
# A custom --listen moves the gRPC port: set BALLAST_COORDINATOR to match.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["ballast", "--timeout", "2", "health"]
# ballastd is PID 1: it waits for SIGTERM with sigwait, drains and exits.
ENTRYPOINT ["ballastd"]
CMD ["--listen", "0.0.0.0:50051", "--http", "0.0.0.0:9090", "--state-dir", "/var/lib/ballast", \
     "--output-root", "/srv/ballast/outputs"]
