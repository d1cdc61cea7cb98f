"""FlashMLA's interface for dense bf16 MLA decode on this package's kernels: ``from mla_lab.flash_mla import
get_mla_metadata, flash_mla_with_kvcache`` in place of ``from flash_mla import ...``.  See
:mod:`mla_lab.core.flash_mla`."""

from .core.flash_mla import (NO_GPU, FlashMLASchedMeta, fastest_stage, flash_mla_with_kvcache,  # noqa: F401
                             get_mla_metadata)

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "fastest_stage"]
