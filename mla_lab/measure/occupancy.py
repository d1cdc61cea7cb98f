"""Occupancy: how many blocks of a kernel one SM holds at once, and what stops more.

A block occupies an SM until it finishes; the SM can take another only if it
has room in each of four resources at once:

* warp slots (``max_threads_per_sm / 32``),
* block slots (``max_blocks_per_sm``),
* registers: allocated per warp, ``registers x 32`` rounded up to 256, from
  four sub-partitions of ``regs_per_sm / 4`` each,
* shared memory: the block's static + dynamic bytes plus the driver's
  reserved 1 KB, rounded up to 128 bytes, out of ``smem_per_sm``.

The answer is the smallest of the four.  The same rules as the CUDA
runtime's ``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` (default carve-out,
no cluster), written out so a reader can follow them; on a GPU the tests hold
this calculator to the runtime's answer for every kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from .roofline import DeviceSpec


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limits: dict  # resource -> blocks that resource alone would allow
    threads_per_block: int
    device: str

    @property
    def limited_by(self) -> str:
        least = min(self.limits.values())
        return ", ".join(k for k, v in self.limits.items() if v == least)

    @property
    def warps_per_sm(self) -> int:
        return self.blocks_per_sm * (-(-self.threads_per_block // 32))

    def fraction(self, device: DeviceSpec) -> float:
        """Active warps over the SM's warp slots: what profilers call occupancy."""
        return self.warps_per_sm / device.max_warps_per_sm


def occupancy(device: DeviceSpec, threads_per_block: int, registers_per_thread: int,
              static_smem_bytes: int = 0, dynamic_smem_bytes: int = 0) -> Occupancy:
    warps = -(-threads_per_block // 32)
    limits: dict[str, int] = {}

    limits["warps"] = device.max_warps_per_sm // warps if threads_per_block <= 1024 else 0
    limits["blocks"] = device.max_blocks_per_sm

    if registers_per_thread == 0:
        limits["registers"] = 1 << 30  # no registers, no limit
    else:
        regs_per_warp = _round_up(registers_per_thread * 32, device.reg_granularity)
        # The hardware checks a block's registers as if its warps were spread
        # over all four sub-partitions evenly.
        fits = (regs_per_warp * _round_up(warps, 4) <= device.regs_per_block
                and registers_per_thread <= device.max_regs_per_thread + 1)
        warps_per_partition = (device.regs_per_sm // 4) // regs_per_warp
        limits["registers"] = (warps_per_partition * 4) // warps if fits else 0

    per_block = _round_up(static_smem_bytes + dynamic_smem_bytes + device.reserved_smem_per_block,
                          device.smem_granularity)
    if per_block > device.smem_per_block_optin + device.reserved_smem_per_block:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = device.smem_per_sm // per_block

    return Occupancy(blocks_per_sm=min(limits.values()), limits=limits, threads_per_block=threads_per_block,
                     device=device.name)
