# The image `hwbench k8s --image` runs on every pod (docs/kubernetes.md, "The image"): hwbench as the
# README installs it, torch pinned as there (from PyPI on Linux that is torch's CUDA build), with the
# deepspeed extra for `--engine deepspeed`. The base is NVIDIA's CUDA development image: DeepSpeed
# compiles its ops with nvcc when a run first needs them. Keep its CUDA at the version torch was built
# for (`python -c "import torch; print(torch.version.cuda)"`): --build-arg CUDA_IMAGE=... for another.
#
#   docker build -t REGISTRY/hwbench:0.1.0 .
#   docker push REGISTRY/hwbench:0.1.0
#   hwbench k8s --image REGISTRY/hwbench:0.1.0 --nnodes 2 --nproc-per-node 8 ... > job.yaml
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential \
    && rm -rf /var/lib/apt/lists/*

# The pods run `/bin/sh -c "exec hwbench run ..."`: hwbench must be on PATH.
RUN python3 -m venv /opt/hwbench
ENV PATH=/opt/hwbench/bin:$PATH

WORKDIR /src/hwbench
COPY pyproject.toml README.md ./
COPY hwbench ./hwbench
RUN pip install --no-cache-dir torch==2.13.0 '.[deepspeed]'

CMD ["hwbench", "--help"]
