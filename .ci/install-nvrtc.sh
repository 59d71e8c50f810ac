#!/usr/bin/env bash
# Installs NVRTC (the CUDA run-time compiler, no GPU needed) from PyPI so the kernel
# compilation test can run on a machine without CUDA, and prints the directory that holds
# libnvrtc.so.13; put it on LD_LIBRARY_PATH before `cargo test --test test_gpu`.
set -euo pipefail
python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 >&2 \
  || python3 -m pip install --quiet --disable-pip-version-check --user nvidia-cuda-nvrtc==13.0.88 >&2 \
  || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages --user nvidia-cuda-nvrtc==13.0.88 >&2
python3 - <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for lib in glob.glob(os.path.join(root, "nvidia", "cu13", "lib")) + glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib")):
        if glob.glob(os.path.join(lib, "libnvrtc.so*")):
            print(lib)
            sys.exit(0)
sys.exit("libnvrtc not found after installing nvidia-cuda-nvrtc")
PY
