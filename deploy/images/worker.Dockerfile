# The worker: ballast-worker and ballast-train, with LibTorch 2.11.0 and the
# CUDA libraries of the torch wheel in its own layout (site-packages/torch/lib
# next to site-packages/nvidia/*/lib), so that libtorch_cuda finds NCCL,
# cuDNN and cudart through its RPATHs. libcuda.so.1 comes from the node's
# driver through the NVIDIA container toolkit; without it the worker offers
# CPU slots (--cpu-slots N). The build context is the staging folder that
# scripts/images (`make images`) fills from `make build`'s binaries.
#
# BASE: Debian 12 by default; with registry access an nvidia/cuda runtime
# image (Ubuntu 24.04 or newer: the binaries need glibc >= 2.36) works too:
#   BALLAST_IMAGE_BASE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 make images
#
# Ports: the rank-0 worker of a job opens the rendezvous store on the
# coordinator-assigned port (29500-30499), and Gloo and NCCL connect between
# nodes on ephemeral ports: run it with host networking (docs/deploy.md).
ARG BASE=docker.io/library/debian:12.11-slim
FROM ${BASE}

COPY site-packages/ /opt/ballast/site-packages/
COPY lib/ /usr/local/lib/ballast/
COPY bin/ /opt/ballast/bin/
RUN echo /usr/local/lib/ballast > /etc/ld.so.conf.d/ballast.conf \
    && ldconfig \
    && useradd --no-log-init --uid 10001 --user-group --home-dir /var/lib/ballast-worker \
       --create-home ballast

ENV PATH=/opt/ballast/bin:$PATH
USER 10001:10001
WORKDIR /var/lib/ballast-worker
# ballast-worker is PID 1: on SIGTERM it stops its ranks and exits.
ENTRYPOINT ["ballast-worker"]
CMD ["--work-dir", "/var/lib/ballast-worker"]
