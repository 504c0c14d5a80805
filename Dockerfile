# syntax=docker/dockerfile:1
#
# Tandem serving image: one image for the gateway, the verifier and the drafter; the pod picks
# the service with the `tandem` subcommand (see deploy/). Build from the repository root:
#
#   docker build -t tandem:0.1.0 .
#
# The base is NVIDIA's CUDA *runtime* image. flashinfer (the `gpu` extra) compiles its attention
# kernels just in time on first use, which needs nvcc and the CUDA headers: the few apt packages
# of that toolchain are added on top of the runtime image (JIT_TOOLCHAIN=0 leaves them out; pods
# must then set TANDEM_ATTENTION=torch). `--build-arg CUDA_FLAVOR=devel` starts from the full
# CUDA devel image instead.
#
# The model cache is a volume at /cache ($TANDEM_CACHE): `tandem fetch` fills it (the deploy/
# manifests run it as an initContainer), and flashinfer's compiled kernels land there too.

# The defaults match the machine the benchmarks ran on (bench/RESULTS.md): CUDA 13.0, torch 2.11
# (cu130), Ubuntu 24.04 with Python 3.12; the nodes need an NVIDIA driver >= 580. For older
# drivers build with CUDA_VERSION=12.8.1 and TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128.
ARG CUDA_VERSION=13.0.0
ARG CUDA_FLAVOR=runtime
ARG UBUNTU=ubuntu24.04

# ---------------------------------------------------------------------------------------- build
FROM nvidia/cuda:${CUDA_VERSION}-${CUDA_FLAVOR}-${UBUNTU} AS build

# torch is not a pinned dependency of the project: the image brings its CUDA build, matching
# the base image's CUDA (cu130 for CUDA 13.0).
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH

RUN pip install --upgrade pip \
 && pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# The build context is the repository less what .dockerignore drops (tests, deploy, .git,
# .venv, ...): pyproject.toml, README.md and every Python package it installs.
WORKDIR /src
COPY . /src
# a regular (not editable) install: the source tree stays behind in this stage
RUN pip install "/src[gpu]" \
 && tandem --help > /dev/null

# -------------------------------------------------------------------------------------- runtime
FROM nvidia/cuda:${CUDA_VERSION}-${CUDA_FLAVOR}-${UBUNTU}

ARG CUDA_VERSION
ARG JIT_TOOLCHAIN=1

ENV DEBIAN_FRONTEND=noninteractive

# python3-venv: the venv's interpreter is the system python3 (3.12 on Ubuntu 24.04).
# The JIT toolchain: nvcc, the CUDA runtime/cccl/curand headers, a host compiler and ninja.
RUN set -eux; \
    cuda_pkg="$(echo "${CUDA_VERSION}" | cut -d. -f1,2 | tr . -)"; \
    packages="python3 python3-venv ca-certificates"; \
    if [ "${JIT_TOOLCHAIN}" = "1" ]; then \
      packages="${packages} python3-dev g++ ninja-build cuda-nvcc-${cuda_pkg} cuda-cudart-dev-${cuda_pkg} \
                cuda-cccl-${cuda_pkg} libcurand-dev-${cuda_pkg}"; \
    fi; \
    apt-get update; \
    apt-get install -y --no-install-recommends ${packages}; \
    rm -rf /var/lib/apt/lists/*

# A fixed non-root uid/gid (10001), so Kubernetes can check runAsNonRoot against the image.
RUN groupadd --gid 10001 tandem \
 && useradd --uid 10001 --gid 10001 --home-dir /home/tandem --create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /cache \
 && chown 10001:10001 /cache

COPY --from=build /opt/tandem /opt/tandem

# TANDEM_CACHE: where `tandem fetch` and the services keep the model (engine/assets.py).
# The other caches point into the same volume or into $HOME, so the root filesystem can be
# read-only (the manifests mount emptyDirs on /tmp and /home/tandem).
ENV PATH=/opt/tandem/bin:$PATH \
    HOME=/home/tandem \
    TANDEM_CACHE=/cache \
    FLASHINFER_WORKSPACE_BASE=/cache/jit \
    TRITON_CACHE_DIR=/cache/jit/triton \
    CUDA_HOME=/usr/local/cuda \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

VOLUME ["/cache"]
USER 10001:10001
WORKDIR /home/tandem

# gateway, verifier, drafter gRPC ports; Prometheus metrics (TANDEM_METRICS_PORT in deploy/); the plaintext
# health-only port of deploy/'s probes (TANDEM_HEALTH_PORT)
EXPOSE 50051 50052 50053 9090 8081

ENTRYPOINT ["tandem"]
# `docker run --gpus all -p 50051:50051 tandem:0.1.0` runs the whole stack in one container: the gateway on every
# interface of the container, with an API key it prints once (or --api-keys-file), the verifier and drafter on its
# loopback with mutual TLS. Kubernetes pods run one service each: `tandem gateway | verifier | drafter`.
CMD ["serve", "--host", "0.0.0.0"]
