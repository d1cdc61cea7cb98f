"""How much work a problem is, and the least time a GPU can do it in.

Counting convention (every chapter and the benchmark use it):

* FLOPs: query row ``t`` of a stream sees ``prefix + t + 1`` keys; each
  (head, key) pair costs a 576-long dot product for the score and a 512-long
  multiply-add into the output, 2 FLOPs per multiply-add:
  ``2 * sum_t H * (prefix + t + 1) * (576 + 512)`` per stream.
* Bytes: the fewest any kernel must move: every cached token read once,
  q read once, out written once (bf16).  Block table, lengths and LSE are
  left out: under 1% of the total here.

The floor is ``max(FLOPs / matrix rate, bytes / bandwidth)``.  The matrix
rate is the bf16 tensor-core one, because that is what a kernel *could* use;
the CUDA-core (fp32 FMA) floor is given beside it, because the kernels of
chapters 1-6 use only CUDA cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.problem import D_QK, D_V, Problem


@dataclass(frozen=True)
class DeviceSpec:
    """Per-SM limits and throughput of one GPU model, with where they come from."""

    name: str
    arch: str  # compute capability, "9.0"
    sms: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    smem_per_sm: int  # bytes a block's shared memory can come from, per SM
    smem_per_block_optin: int  # the most one block may ask for (after opting in)
    reserved_smem_per_block: int  # the driver's own share of every block
    smem_granularity: int  # allocation unit of shared memory
    reg_granularity: int  # registers are allocated to warps in units of this
    l2_bytes: int
    bandwidth_tbs: float  # datasheet memory bandwidth, TB/s
    bf16_tflops: float  # datasheet dense bf16 tensor-core rate
    fp32_tflops: float  # datasheet fp32 CUDA-core rate (an FMA counts 2)
    measured_bandwidth_tbs: float | None = None
    measured_bf16_tflops: float | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // 32

    @property
    def warp_size(self) -> int:
        return 32

    def bandwidth(self) -> float:
        """Bytes per second to plan with: measured if known, else the datasheet's."""
        return (self.measured_bandwidth_tbs or self.bandwidth_tbs) * 1e12

    def matrix_rate(self) -> float:
        return (self.measured_bf16_tflops or self.bf16_tflops) * 1e12

    def fp32_rate(self) -> float:
        return self.fp32_tflops * 1e12


_HOPPER_SM = dict(
    arch="9.0", max_threads_per_sm=2048, max_blocks_per_sm=32, regs_per_sm=65536, regs_per_block=65536,
    max_regs_per_thread=255, smem_per_sm=233472, smem_per_block_optin=232448, reserved_smem_per_block=1024,
    smem_granularity=128, reg_granularity=256,
)

DEVICES: dict[str, DeviceSpec] = {
    "h200": DeviceSpec(
        name="NVIDIA H200 (SXM)", sms=132, l2_bytes=60 * 2**20, bandwidth_tbs=4.8, bf16_tflops=989.0,
        fp32_tflops=67.0, measured_bandwidth_tbs=4.25, measured_bf16_tflops=687.0,
        sources=(
            "NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s; H100 SXM's SM and rates (989 dense bf16, 67 fp32)",
            "CUDA C++ Programming Guide, compute capability 9.0: 2048 threads, 32 blocks, 64K registers, "
            "228 KB shared memory per SM, 227 KB per block, 1 KB reserved per block",
            "cuda_occupancy.h (CUDA 13.0): 128-byte shared memory and 256-register allocation units",
            "measured on an H200 on 2026-11-29 by timing.measure_ceilings (a device-to-device copy and an "
            "8192^3 bf16 matmul): 4.25 TB/s copy, 687 TFLOP/s bf16 matmul; L2 as torch reports it there",
        ),
        **_HOPPER_SM,
    ),
    "h100": DeviceSpec(
        name="NVIDIA H100 SXM", sms=132, l2_bytes=50 * 2**20, bandwidth_tbs=3.35, bf16_tflops=989.0,
        fp32_tflops=67.0,
        sources=("NVIDIA H100 datasheet (SXM5): 3.35 TB/s, 989 dense bf16 TFLOP/s, 67 fp32 TFLOP/s, 50 MB L2",
                 "CUDA C++ Programming Guide, compute capability 9.0"),
        **_HOPPER_SM,
    ),
    "rtx_pro_6000": DeviceSpec(
        name="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", sms=188, max_threads_per_sm=1536, max_blocks_per_sm=24,
        regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255, smem_per_sm=102400,
        smem_per_block_optin=101376, reserved_smem_per_block=1024, smem_granularity=128, reg_granularity=256,
        l2_bytes=128 * 2**20, bandwidth_tbs=1.792, bf16_tflops=500.0, fp32_tflops=125.0,
        sources=(
            "NVIDIA RTX PRO 6000 Blackwell announcement (GTC 2025): 188 SMs, 24,064 CUDA cores, up to 125 "
            "TFLOP/s fp32, 96 GB GDDR7 on 512 bits at 28 Gbps = 1792 GB/s, 128 MB L2",
            "bf16 dense tensor rate: NVIDIA's 4000 sparse FP4 TOPS / 2 (dense) / 4 (bf16 vs fp4) = 500",
            "CUDA C++ Programming Guide, compute capability 12.0: 1536 threads and 48 warps per SM, "
            "100 KB shared memory per SM, 99 KB per block; cuda_occupancy.h (CUDA 13.0): 24 blocks per SM",
        ),
    ),
}


def device_for_arch(arch: str) -> DeviceSpec:
    for d in DEVICES.values():
        if d.arch == arch:
            return d
    raise KeyError(f"no device with compute capability {arch} in the table: {sorted(DEVICES)}")


def device_spec_for(name: str, cc: tuple[int, int], sms: int) -> tuple[DeviceSpec | None, str]:
    """The table's entry for a GPU given by its name, compute capability and SM count, and a note saying so.

    An entry is used only when it is that model: its key starts the GPU's name
    as ``results.gpu_slug`` writes it (``NVIDIA H200`` -> ``h200``), and its
    compute capability and SM count are the GPU's.  Otherwise the answer is
    ``None``, and the note says why: a GPU the table lacks never gets another
    model's figures.
    """
    from .results import gpu_slug

    arch, here = f"{cc[0]}.{cc[1]}", f"{name} (sm_{cc[0]}{cc[1]}, {sms} SMs)"
    slug = gpu_slug(name)
    key = next((k for k in sorted(DEVICES, key=len, reverse=True) if slug.startswith(k)), None)
    if key is None:
        return None, (f"{here} is not in mla_lab.measure.roofline.DEVICES ({', '.join(DEVICES)}): no datasheet figures "
                      "or per-SM limits for it; floors use only the ceilings measured on it")
    spec = DEVICES[key]
    if (spec.arch, spec.sms) != (arch, sms):
        return None, (f"{here} is not the table's '{key}' ({spec.name}: sm_{spec.arch.replace('.', '')}, "
                      f"{spec.sms} SMs): none of that entry's figures are used; floors use only the ceilings "
                      "measured on it")
    return spec, f"{here}: datasheet figures and per-SM limits from the table's '{key}' entry ({spec.name})"


def device_spec_for_current_gpu(device: int = 0) -> tuple[DeviceSpec | None, str]:
    """:func:`device_spec_for` the GPU ``device`` of this machine; ``(None, note)`` without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None, "no CUDA GPU here: no device to look up"
    props = torch.cuda.get_device_properties(device)
    return device_spec_for(props.name, (props.major, props.minor), props.multi_processor_count)


def flops(p: Problem) -> float:
    keys = 0
    for prefix in p.prefixes:
        # rows t = 0 .. q_len-1 see prefix + t + 1 keys
        keys += p.q_len * prefix + p.q_len * (p.q_len + 1) // 2
    return 2.0 * p.heads * keys * (D_QK + D_V)


def fma_count(p: Problem) -> float:
    return flops(p) / 2


def min_bytes(p: Problem) -> float:
    kv = sum(p.kv_lens) * D_QK * 2
    q = p.streams * p.q_len * p.heads * D_QK * 2
    out = p.streams * p.q_len * p.heads * D_V * 2
    return float(kv + q + out)


@dataclass(frozen=True)
class Floor:
    flops: float
    bytes: float
    compute_us: float  # at the bf16 tensor-core rate
    memory_us: float
    cuda_core_us: float  # at the fp32 CUDA-core rate

    @property
    def floor_us(self) -> float:
        return max(self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_us >= self.memory_us else "memory"

    @property
    def cuda_core_floor_us(self) -> float:
        return max(self.cuda_core_us, self.memory_us)


def floor(p: Problem, device: DeviceSpec | str | None = "h200", *, bandwidth: float | None = None,
          matrix_rate: float | None = None, fp32_rate: float | None = None) -> Floor:
    """Floors of ``p`` on ``device``; pass ``bandwidth`` (B/s), ``matrix_rate`` or ``fp32_rate`` (FLOP/s)
    measured in a run.  ``device=None`` (a GPU the table lacks) needs all three."""
    if isinstance(device, str):
        device = DEVICES[device]
    if device is None and None in (bandwidth, matrix_rate, fp32_rate):
        raise ValueError("floor without a device entry needs measured bandwidth, matrix_rate and fp32_rate")
    f, b = flops(p), min_bytes(p)
    bw = bandwidth or device.bandwidth()
    mr = matrix_rate or device.matrix_rate()
    fr = fp32_rate or device.fp32_rate()
    return Floor(flops=f, bytes=b, compute_us=f / mr * 1e6, memory_us=b / bw * 1e6, cuda_core_us=f / fr * 1e6)


def achieved(p: Problem, us: float) -> tuple[float, float]:
    """(TB/s, TFLOP/s) a kernel that took ``us`` achieved, counted the same way as the floor."""
    return min_bytes(p) / us / 1e6, flops(p) / us / 1e6
