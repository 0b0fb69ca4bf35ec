# The GPU image: the evaluator, one container per GPU.
#   docker build -f docker/gpu.Dockerfile -t kernelswarm-gpu .
# NVIDIA's CUDA *devel* image, since the evaluator compiles: nvcc builds the `cuda` language's cubins
# and torch's cpp extensions, and pycuda is built here against the toolkit's headers. PyTorch is the
# official wheel for the same CUDA major. libcuda.so.1 is not in the image: the NVIDIA Container
# Toolkit mounts the host driver's at run time (a driver for CUDA 13.0 or newer: R580+).
#
# Without a registry, from a base with no CUDA toolkit (no /usr/local/cuda/bin/nvcc), the toolkit
# comes from NVIDIA's wheels on the package index instead, and torch from the package index too:
#   docker build -f docker/gpu.Dockerfile --build-arg CUDA_IMAGE=kernelswarm-local/python:3.11-bookworm \
#       -t kernelswarm-gpu .          # the Debian base docker/local-bases.sh makes
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ARG PYCUDA_VERSION=2026.1
# Used only on a base without a toolkit, in place of TORCH_INDEX: the index torch and the toolkit's
# wheels come from (its torch 2.13.0 for Linux is the CUDA 13.0 build: it requires
# cuda-toolkit==13.0.3), and the version of NVIDIA's `cuda-toolkit` metapackage, the one torch
# requires (13.0.3: nvcc and ptxas 13.0.88).
ARG WHEELS_INDEX=https://pypi.org/simple
ARG CUDA_WHEELS_VERSION=13.0.3

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CUDA_HOME=/usr/local/cuda \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH

# Python 3.12 (Ubuntu 24.04's; Debian 12's is 3.11), its headers for pycuda, g++ as nvcc's and
# torch.compile's host compiler, ninja for torch's cpp_extension (the `cuda_cpp` language's builds).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ make ninja-build \
 && rm -rf /var/lib/apt/lists/*

# On a base without a toolkit: NVIDIA's wheels (nvcc, ptxas, cicc, the headers, cudart, curand; torch
# brings the other libraries) land in site-packages/nvidia/cu13, and /usr/local/cuda is laid out as
# the toolkit's: bin, include and nvvm are the wheels' folders, lib64 links to their libraries under
# the unversioned names too (-lcudart for torch's extensions, -lcurand for pycuda) and is on the
# loader's path, and lib64/stubs/libcuda.so stands in for the driver at link time as the toolkit's stub
# does: made here, one empty function per cu* name that cuda.h and cudaProfiler.h declare, soname
# libcuda.so.1.
RUN python3 -m venv /opt/venv \
 && if [ -x /usr/local/cuda/bin/nvcc ]; then \
        pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"; \
    else \
        pip install --index-url "${WHEELS_INDEX}" "torch==${TORCH_VERSION}" \
            "cuda-toolkit[nvcc,cccl,cudart,curand,profiler]==${CUDA_WHEELS_VERSION}" \
     && wheels="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu${CUDA_WHEELS_VERSION%%.*}" \
     && mkdir -p /usr/local/cuda/lib64/stubs \
     && ln -s "$wheels/bin" "$wheels/include" "$wheels/nvvm" /usr/local/cuda/ \
     && ln -s /usr/local/cuda/lib64 "$wheels/lib64" \
     && for lib in "$wheels"/lib/lib*; do \
            name="${lib##*/}"; ln -sf "$lib" "/usr/local/cuda/lib64/$name"; \
            case "$name" in *.so.*) ln -sf "$lib" "/usr/local/cuda/lib64/${name%%.so.*}.so";; esac; \
        done \
     && printf '#include <cuda.h>\n#include <cudaProfiler.h>\n' | gcc -E -P -I"$wheels/include" -x c - \
        | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u | sed 's/.*/void &(void) {}/' \
        | gcc -x c -shared -fPIC -Wl,-soname,libcuda.so.1 -o /usr/local/cuda/lib64/stubs/libcuda.so - \
     && echo /usr/local/cuda/lib64 > /etc/ld.so.conf.d/cuda-wheels.conf && ldconfig; \
    fi \
 && nvcc --version | tail -n 2 \
 && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); \
assert (torch.version.cuda or '').split('.')[0] == '13', 'torch is not a CUDA 13 build'"

# pycuda from source against this toolkit. It links -lcuda: at build time the toolkit's stub
# library (from the wheels: the one made above) stands in for the driver's (LIBRARY_PATH is for this
# step only), and its module must name libcuda.so.1, which the driver provides at run time.
# pycuda.driver cannot be imported here, with no driver; the evaluator imports it at run time.
RUN LIBRARY_PATH=/usr/local/cuda/lib64/stubs \
    pip install --no-binary pycuda "pycuda==${PYCUDA_VERSION}" \
 && python -c "import pycuda; print('pycuda', pycuda.VERSION_TEXT)" \
 && readelf -d /opt/venv/lib/python3*/site-packages/pycuda/_driver*.so | grep -F '[libcuda.so.1]'

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
