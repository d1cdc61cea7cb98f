"""mla_lab: a workbook of CUDA kernels for MLA verify attention (speculative decoding)."""

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
