#!/usr/bin/python3
"""depcheck: every #include in include/ and src/ keeps the one-way module order.

A file's module is the folder after include/hymoe/ or src/ (src/main.cpp is `main`). An include of
"hymoe/M/..." (or a relative path that resolves into M) is allowed when M is the file's own module
or one it may depend on (ALLOWED below: core <- text <- deck; core <- tensor <- backend <- parallel
<- model <- io/runtime <- main). System headers: CUDA, cuBLAS and NCCL only under src/backend/cuda
and src/parallel; MPI and HDF5 only in parallel, io, runtime and main (model/ and backend/ include
neither). Prints one line per violation, FILE:LINE: why, and exits 1 if there is any.
Usage: scripts/depcheck.py [ROOT]   (ROOT: the repository, default the current folder)
"""
import os
import re
import sys

ALLOWED = {
    "core": set(),
    "text": {"core"},
    "deck": {"core", "text"},
    "tensor": {"core"},
    "backend": {"core", "tensor"},
    "parallel": {"core", "tensor", "backend", "deck"},
    "model": {"core", "tensor", "backend", "parallel"},
    "io": {"core", "tensor", "backend", "parallel", "deck", "text"},
    "runtime": {"core", "tensor", "backend", "parallel", "deck", "text", "model", "io"},
    "main": {"core", "tensor", "backend", "parallel", "deck", "text", "model", "io", "runtime"},
}
CUDA_HEADER = re.compile(r"^(cuda|cublas|cub/|nccl|curand|cusparse|thrust/|mma\.h|cooperative_groups)")
MPI_HDF5_HEADER = re.compile(r"^(mpi\.h|hdf5|H5)")
CUDA_DIRS = ("src/backend/cuda/", "src/parallel/")
MPI_HDF5_MODULES = {"parallel", "io", "runtime", "main"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def module_of(path):
    """The module of a repository-relative path, or None outside include/hymoe and src."""
    if path == "src/main.cpp":
        return "main"
    for prefix in ("include/hymoe/", "src/"):
        if path.startswith(prefix):
            rest = path[len(prefix):]
            return rest.split("/", 1)[0] if "/" in rest else None
    return None


def check_file(root, path):
    own = module_of(path)
    if own is None:
        return []
    if own not in ALLOWED:
        return [f"{path}:1: module '{own}' is not in depcheck's module order"]
    problems = []
    with open(os.path.join(root, path), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            quote, name = m.groups()
            if quote == '"':
                if name.startswith("hymoe/"):
                    target = module_of("include/" + name)
                else:  # a private header beside the file (or ../): resolve it
                    target = module_of(os.path.normpath(os.path.join(os.path.dirname(path), name)))
                if target and target != own and target not in ALLOWED[own]:
                    problems.append(f"{path}:{n}: {own} includes {target} ({name}); "
                                    f"{own} may include only {', '.join(sorted(ALLOWED[own])) or 'itself'}")
            else:
                if CUDA_HEADER.match(name) and not path.startswith(CUDA_DIRS):
                    problems.append(f"{path}:{n}: CUDA header <{name}> outside src/backend/cuda "
                                    "and src/parallel")
                if MPI_HDF5_HEADER.match(name) and own not in MPI_HDF5_MODULES:
                    problems.append(f"{path}:{n}: <{name}> in module {own}; MPI and HDF5 headers "
                                    f"belong to {', '.join(sorted(MPI_HDF5_MODULES))}")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files = []
    for top in ("include", "src"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    files.append(os.path.relpath(os.path.join(dirpath, name), root))
    problems = [p for path in sorted(files) for p in check_file(root, path)]
    for p in problems:
        print(p)
    print(f"depcheck: {len(files)} files, {len(problems)} violation{'s' if len(problems) != 1 else ''}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
