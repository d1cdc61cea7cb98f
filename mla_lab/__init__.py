"""mla_lab: a workbook of CUDA kernels for MLA verify attention (speculative decoding).

The API (docs/api.md): ``attention(stage, q, kv_cache, block_table, kv_lens, scale)`` runs any stage of
``STAGES``; ``reference_attention`` is the fp32 answer; ``load_ops()`` exposes ``torch.ops.mla_lab.<stage>``;
``verify_attention`` checks a stage against the reference; ``VerifyStep``/``VerifySteps`` replay a call from
a CUDA graph; ``mla_lab.flash_mla`` is FlashMLA's interface on these kernels.  Layouts: ``q`` [streams,
q_len, heads, 576] bf16, ``kv_cache`` [pages, page_size, 576] bf16, ``block_table`` [streams, max_pages]
int32, ``kv_lens`` [streams] int32; ``out`` [streams, q_len, heads, 512] bf16, ``lse`` [streams, q_len,
heads] fp32.  Without a GPU, ``reference_attention`` and ``attention("triton", ...)`` (Triton's interpreter)
run on CPU tensors; the rest raises an ``InputError`` that says so.
"""

from .core.problem import DEFAULT_SCALE, D_QK, D_V, Problem, Workload, make_workload
from .core.reference import reference_attention
from .core.stages import STAGES

__all__ = ["DEFAULT_SCALE", "D_QK", "D_V", "Problem", "Workload", "make_workload", "reference_attention",
           "STAGES", "attention", "verify_attention", "load_ops", "VerifyStep", "VerifySteps"]


def __getattr__(name):
    # Lazy: importing the package must not build the extension or import triton.
    if name == "attention":
        from .core.ops import attention
        return attention
    if name == "load_ops":  # builds (first time) and loads the extension: torch.ops.mla_lab.<stage>
        from .core.ops import load_ops
        return load_ops
    if name == "verify_attention":
        from .core.verify import verify_attention
        return verify_attention
    if name in ("VerifyStep", "VerifySteps"):  # a verify call captured once per bucket and replayed
        from .serving import verify_step
        return getattr(verify_step, name)
    raise AttributeError(name)
