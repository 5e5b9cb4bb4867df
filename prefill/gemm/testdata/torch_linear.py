"""The peer of BenchmarkMulT: C = A·Bᵀ on the same shapes with PyTorch's
F.linear (which calls the BLAS the process loaded: Debian's torch links
libblas.so.3; put OpenBLAS on LD_LIBRARY_PATH to measure it), 2 threads.
Prints GFLOP/s of wall time and per CPU-second of the process, median of 5,
and the BLAS library it loaded. See BENCHMARKS.md ("prefill/gemm").

    LD_LIBRARY_PATH=.../openblas-pthread OPENBLAS_CORETYPE=Haswell \
        python3 prefill/gemm/testdata/torch_linear.py
"""
import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
print("torch", torch.__version__, "threads", torch.get_num_threads())
for m, n, k in [(128, 1152, 896), (128, 896, 896), (128, 9728, 896), (128, 896, 4864),
                (512, 9728, 896), (1, 4864, 896), (1, 896, 4864), (1, 32768, 896)]:
    a, b = torch.randn(m, k), torch.randn(n, k)
    F.linear(a, b)
    reps = max(1, int(2e9 / (2 * m * n * k)))
    walls, cpus = [], []
    for _ in range(5):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(reps):
            F.linear(a, b)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    gflop = 2 * m * n * k * reps / 1e9
    print(f"{m}x{n}x{k}: {gflop / statistics.median(walls):.1f} GFLOP/s, "
          f"{gflop / statistics.median(cpus):.1f} GFLOP/CPU-s "
          f"(min-max wall {gflop / max(walls):.1f}-{gflop / min(walls):.1f})")
with open("/proc/self/maps") as f:
    print("blas:", sorted({l.split()[-1] for l in f if "blas" in l.lower() and "/" in l}))
