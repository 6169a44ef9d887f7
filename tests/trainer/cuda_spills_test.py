"""The CUDA kernels' resource use as ptxas reported it when they were compiled (kept
by scripts/ptxas_report.sh next to each object): prints registers, shared memory and
spills of every kernel for every architecture, and fails if any kernel spills to local
memory. Runs without a GPU: it reads the build's reports.

usage: cuda_spills_test.py OBJECT_DIR
"""
import pathlib
import re
import sys

reports = sorted(pathlib.Path(sys.argv[1]).rglob("*.ptxas.txt"))
if not reports:
    sys.exit(f"no ptxas reports under {sys.argv[1]}: was the CUDA module built through scripts/ptxas_report.sh?")
kernels = 0
spilled = []
for report in reports:
    name = arch = None
    stores = loads = 0
    for line in report.read_text().splitlines():
        if m := re.search(r"Compiling entry function '(\S+)' for '(\S+)'", line):
            name, arch = m.group(1), m.group(2)
        elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            stores, loads = int(m.group(1)), int(m.group(2))
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            smem = re.search(r"(\d+) bytes smem", line)
            short = re.sub(r"^_ZN4dufu7trainer4cuda\d+_GLOBAL__N__\w+?_cu_[0-9a-f]+\d+", "", name)[:48]
            print(f"{report.name.split('.')[0]:12} {arch:6} {short:48} registers {int(m.group(1)):3}  "
                  f"smem {int(smem.group(1)) if smem else 0:6} B  spills {stores}/{loads} B")
            kernels += 1
            if stores or loads:
                spilled.append(f"{name} ({arch})")
            name = None
print(f"{kernels} kernel builds, {len(spilled)} with spills")
if kernels == 0 or spilled:
    sys.exit("spilling kernels: " + ", ".join(spilled) if spilled else "no kernels found in the reports")
