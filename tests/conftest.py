import os
import warnings

# Tests run with one torch thread: on 2 cores this is both faster and deterministic.
os.environ.setdefault("RLVR_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Same floats on every x86 CPU (docs/training.md, "Reproducible numbers across CPUs"): by default
# torch runs its own vectorized kernels (softmax, exp, norms, reductions, ...) at the widest ISA of
# the machine (AVX2 or AVX-512) and MKL picks a GEMM code path per CPU, so the same seeded training
# ended at different accuracies on AVX2 and AVX-512 machines. Pinned here: torch's portable
# "default" kernels, and MKL's SSE2 "compatible" branch under conditional numerical reproducibility
# (meant for any SSE2 CPU; MKL_CBWR=AVX2 falls back to per-CPU dispatch on AMD). Both are read once,
# before the first kernel runs, so they must be set before torch is imported; an explicit value in
# the environment wins (e.g. ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AUTO for the machine's native path).
# Not pinned: oneDNN (ONEDNN_MAX_CPU_ISA), which the float32 CPU training path never calls
# (ONEDNN_VERBOSE=1 prints nothing); MKL's only routine there is SGEMM (MKL_VERBOSE=1).
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")

import torch  # noqa: E402

torch.set_num_threads(1)

if torch.backends.cpu.get_cpu_capability().lower() != os.environ["ATEN_CPU_CAPABILITY"].lower():
    warnings.warn(  # torch was imported (and a kernel ran) before this file: the pin came too late
        f"ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']} not in effect (torch uses "
        f"{torch.backends.cpu.get_cpu_capability()}); learning-test numbers may differ across CPUs",
        stacklevel=1,
    )
