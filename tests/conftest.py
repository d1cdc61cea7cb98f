import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    # Triton kernels run in its interpreter on CPU tensors; the flag must be set
    # before any @triton.jit function is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (this machine has none)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "compile: compiles builds beside the extension (experiments, other GPUs) and "
                                       "reads their SASS; not in a plain run: `python -m pytest -m compile` runs them")
    config.addinivalue_line("markers", "slow: minutes of CPU models or Triton's interpreter (the fuzz and the extreme "
                                       "values over every stage's model, the acceptance loop); not in a plain run: "
                                       "`python -m pytest -m slow` runs them")


@pytest.fixture(scope="session")
def ext():
    """The compiled extension (built for sm_90 and sm_120 without a GPU, the local arch with one)."""
    from mla_lab.core.ops import extension

    return extension()
