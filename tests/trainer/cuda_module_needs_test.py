"""The CUDA device's module does not need NCCL's library to load: libnccl must not be
among its DT_NEEDED entries (readelf -d), because a one-GPU run, or a machine without
NCCL, loads the module and never opens NCCL (nccl_collectives.cu opens libnccl.so.2
with dlopen when a group of several GPUs asks). Runs without a GPU: it reads the build.

usage: cuda_module_needs_test.py MODULE
"""
import re
import subprocess
import sys

module = sys.argv[1]
dynamic = subprocess.run(["readelf", "-d", module], capture_output=True, text=True)
if dynamic.returncode != 0:
    sys.exit(f"readelf -d {module} failed: {dynamic.stderr.strip()}")
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic.stdout)
print(f"{module} needs: {', '.join(needed)}")
if not needed:
    sys.exit("no DT_NEEDED entries found: is this the module?")
nccl = [library for library in needed if library.startswith("libnccl")]
if nccl:
    sys.exit(f"the CUDA module links NCCL ({', '.join(nccl)}): a one-GPU run would need NCCL to load it")
