# syntax=docker/dockerfile:1
# The GPU image: the evaluator, one container per GPU.
#   docker build -f docker/gpu.Dockerfile -t kernelswarm-gpu .
# NVIDIA's CUDA *devel* image, since the evaluator compiles: nvcc builds the `cuda` language's cubins
# and torch's cpp extensions, and pycuda is built here against the toolkit's headers. PyTorch is the
# official wheel for the same CUDA major. libcuda.so.1 is not in the image: the NVIDIA Container
# Toolkit mounts the host driver's at run time (a driver for CUDA 13.0 or newer: R580+).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ARG PYCUDA_VERSION=2026.1

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CUDA_HOME=/usr/local/cuda \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH

# Python 3.12 (Ubuntu 24.04's), its headers for pycuda, g++ as nvcc's and torch.compile's host compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ make \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv \
 && pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

# pycuda from source against this toolkit. It links -lcuda: at build time the toolkit's stub
# library stands in for the driver's (LIBRARY_PATH is for this step only). pycuda.driver cannot be
# imported here, with no driver; the evaluator imports it at run time.
RUN LIBRARY_PATH=/usr/local/cuda/lib64/stubs \
    pip install --no-binary pycuda "pycuda==${PYCUDA_VERSION}" \
 && python -c "import pycuda; print('pycuda', pycuda.VERSION_TEXT)"

# NVIDIA's CuTe DSL for language `cute_dsl` (its CUDA 13 libraries; cuda-python for its driver calls).
# Without it the evaluator answers `cute_dsl` attempts UNSUPPORTED.
ARG CUTE_DSL_VERSION=4.8.1
RUN pip install "nvidia-cutlass-dsl[cu13]==${CUTE_DSL_VERSION}" "cuda-python>=13" \
 && python -c "import cutlass.cute; print('cute dsl ${CUTE_DSL_VERSION}')"

WORKDIR /app
COPY pyproject.toml README.md ./
RUN mkdir -p shared services kernelswarm \
 && touch shared/__init__.py services/__init__.py kernelswarm/__init__.py \
 && pip install -e ".[gpu,postgres]"
COPY shared shared
COPY services services
COPY kernelswarm kernelswarm
COPY problems problems
COPY docker/init.py docker/healthcheck.py docker/

# The image runs as `kernelswarm`. docker-compose.yml starts the evaluator as root *in its container*
# so that the sandbox can run candidates as `nobody` in a network namespace of their own
# (services/evaluator/sandbox/isolation.py); see docs/deploy.md, "The evaluator's sandbox".
RUN useradd --create-home --uid 10001 --user-group kernelswarm \
 && mkdir -p /var/lib/kernelswarm \
 && chown kernelswarm:kernelswarm /var/lib/kernelswarm
USER kernelswarm
ENV KERNELSWARM_HOME=/var/lib/kernelswarm \
    KERNELSWARM_PROBLEMS_DIR=/app/problems \
    KERNELSWARM_DEVICE=cuda
VOLUME /var/lib/kernelswarm
CMD ["celery", "-A", "services.evaluator.entrypoint", "worker", "-Q", "evaluate.cuda", "--pool", "solo", \
     "--concurrency", "1", "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle", "-n", "evaluator@%h"]
