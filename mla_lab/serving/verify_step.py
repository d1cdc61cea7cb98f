"""A captured verify step: one stage's attention call, recorded once per bucket and replayed.

A decode loop calls verify attention thousands of times on inputs of the same
shape.  Launching the kernels from Python costs the host tens of microseconds
per call; at short prefixes that is more than the kernels take.  A CUDA graph
records the launches once and replays them with one call, but it replays them
with the same arguments: the same pointers, the same grid, the same scalars.
So the inputs live in static buffers the graph was recorded with, and a step
copies each call's inputs into them.

That works for every stage because nothing a launch decides on the host
depends on the lengths or the page ids: the kernels read both from device
memory, the split stages choose their split count from the block table's
*width* (host-known), and the Triton baseline derives each decode row's length
on the GPU.  So changing lengths or tables between replays needs no new
capture; a new bucket (more streams, a wider table) does.

Padding: a bucket of ``streams`` may be called with fewer.  The streams beyond
them get length 0, which every kernel answers with NaN for that stream
*without reading anything* (a stream shorter than its draft is refused), and
page 0 in their table row.  Their rows of ``out`` and ``lse`` are never
returned, and streams are independent, so nothing leaks into real streams.
"""

from __future__ import annotations

import torch

from ..core import ops
from ..core import stages as _stages
from .model_step import load_bucket
from ..core.problem import D_QK, D_V, DEFAULT_SCALE
from ..core.stages import Stage
from ..core.validate import InputError


def _require_gpu(st: Stage, kv_cache, graph: bool) -> None:
    """One clear error, before any torch call fails on its own, where the step cannot run on the cache's device."""
    dev = getattr(kv_cache, "device", None)
    if dev is not None and dev.type != "cuda" and (graph or st.is_cuda):
        why = "captures a CUDA graph" if graph and not st.is_cuda else f"runs the CUDA stage {st.id!r}"
        raise InputError(f"VerifyStep {why} and needs kv_cache on a CUDA GPU, got it on {dev}. Without a GPU, "
                         "VerifyStep(\"triton\", ..., graph=False) runs the Triton baseline eagerly in Triton's "
                         "interpreter, and mla_lab.reference_attention gives the fp32 answer")


class VerifyStep:
    """Verify attention for one bucket (streams, q_len, heads, table width), as a replayed CUDA graph.

    ``step(q, block_table, kv_lens)`` copies the inputs into the statics and
    replays; it returns views of the static ``out`` and ``lse`` for the real
    streams (valid until the next call).  To skip the copies, write
    ``step.q``, ``step.block_table`` and ``step.kv_lens`` directly and call
    :meth:`replay`.  ``num_splits`` is fixed at capture (the stage's rule for
    the bucket unless given); an eager call with the same split count gives the
    same bits, for every stage (a test pads real batches with streams of
    length 0 and compares).  ``graph=False`` runs the same call eagerly (no
    GPU graph).  Without a GPU only ``VerifyStep("triton", ..., graph=False)``
    runs (Triton's interpreter, on CPU tensors); anything else raises one
    :class:`InputError` that says so.
    """

    def __init__(self, stage: str | Stage, kv_cache: torch.Tensor, *, streams: int, q_len: int, heads: int,
                 max_pages: int, scale: float = DEFAULT_SCALE, num_splits: int | None = None, graph: bool = True):
        st = stage if isinstance(stage, Stage) else _stages.get(stage)
        _require_gpu(st, kv_cache, graph)
        if min(streams, q_len, heads, max_pages) < 1:
            raise InputError(f"a bucket needs streams, q_len, heads and max_pages >= 1; got {streams}, {q_len}, "
                             f"{heads}, {max_pages}")
        dev = kv_cache.device
        self.stage, self.kv_cache, self.scale = st, kv_cache, float(scale)
        self.streams, self.q_len, self.heads, self.max_pages = streams, q_len, heads, max_pages
        self.q = torch.zeros(streams, q_len, heads, D_QK, dtype=torch.bfloat16, device=dev)
        self.block_table = torch.zeros(streams, max_pages, dtype=torch.int32, device=dev)
        self.kv_lens = torch.zeros(streams, dtype=torch.int32, device=dev)  # 0: a padded stream
        self.out = torch.empty(streams, q_len, heads, D_V, dtype=torch.bfloat16, device=dev)
        self.lse = torch.empty(streams, q_len, heads, dtype=torch.float32, device=dev)
        if num_splits is None:
            if st.kind == "triton":
                num_splits = _stages.TRITON_DEFAULT_SPLITS
            elif st.splits:
                num_splits = ops.default_num_splits(st, self.q, kv_cache, self.block_table)
            else:
                num_splits = 1
        self.num_splits = num_splits
        self._ns = num_splits if st.takes_num_splits else None  # what attention() takes
        self._real = streams
        self.graph: torch.cuda.CUDAGraph | None = None
        if graph:
            self.capture()

    def _call(self) -> None:
        ops.attention(self.stage, self.q, self.kv_cache, self.block_table, self.kv_lens, self.scale,
                      out=self.out, lse=self.lse, num_splits=self._ns, check=False)

    def capture(self) -> "VerifyStep":
        from ..measure.timing import cuda_graph

        self.graph = cuda_graph(self._call, warmup_calls=2)
        return self

    def load(self, q: torch.Tensor, block_table: torch.Tensor, kv_lens: torch.Tensor) -> int:
        """Copy one call's inputs into the statics, padding the streams beyond them; returns their count."""
        b = q.shape[0] if q.dim() == 4 else -1
        if not (1 <= b <= self.streams and q.shape[1:] == (self.q_len, self.heads, D_QK)
                and block_table.dim() == 2 and block_table.shape[0] == b and block_table.shape[1] <= self.max_pages
                and kv_lens.shape == (b,)):
            raise InputError(f"{self.stage.id} verify step: the bucket takes q [<= {self.streams}, {self.q_len}, "
                             f"{self.heads}, {D_QK}], block_table [streams, <= {self.max_pages}] and kv_lens "
                             f"[streams]; got q {tuple(q.shape)}, block_table {tuple(block_table.shape)}, "
                             f"kv_lens {tuple(kv_lens.shape)}")
        self.q[:b].copy_(q)
        load_bucket(self.block_table, self.kv_lens, block_table, kv_lens, self._real)
        self._real = b
        return b

    def replay(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._call()
        return self.out[:self._real], self.lse[:self._real]

    def __call__(self, q, block_table, kv_lens) -> tuple[torch.Tensor, torch.Tensor]:
        self.load(q, block_table, kv_lens)
        return self.replay()

    def eager(self, q, block_table, kv_lens) -> tuple[torch.Tensor, torch.Tensor]:
        """The same stage on the same inputs as a plain eager call with this step's split count (for checks)."""
        return ops.attention(self.stage, q, self.kv_cache, block_table, kv_lens, self.scale, num_splits=self._ns,
                             check=False)


class VerifySteps:
    """One :class:`VerifyStep` per bucket, captured the first time a call needs it.

    A call with ``b`` streams and a table ``w`` pages wide goes to the smallest
    bucket in ``stream_buckets`` x ``page_buckets`` that holds it.
    """

    def __init__(self, stage, kv_cache, *, q_len: int, heads: int, stream_buckets=(1, 2, 4, 8, 16, 32),
                 page_buckets=(256, 1024, 4096, 16384, 65536), scale: float = DEFAULT_SCALE):
        self.stage, self.kv_cache, self.q_len, self.heads, self.scale = stage, kv_cache, q_len, heads, scale
        self.stream_buckets, self.page_buckets = sorted(stream_buckets), sorted(page_buckets)
        self.steps: dict[tuple[int, int], VerifyStep] = {}

    def bucket(self, streams: int, width: int) -> tuple[int, int]:
        s = next((x for x in self.stream_buckets if x >= streams), None)
        p = next((x for x in self.page_buckets if x >= width), None)
        if s is None or p is None:
            raise InputError(f"no bucket holds {streams} streams and a table {width} pages wide (buckets: streams "
                             f"{self.stream_buckets}, pages {self.page_buckets})")
        return s, p

    def __call__(self, q, block_table, kv_lens):
        key = self.bucket(q.shape[0], block_table.shape[1])
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = VerifyStep(self.stage, self.kv_cache, streams=key[0], q_len=self.q_len,
                                                heads=self.heads, max_pages=key[1], scale=self.scale)
        return step(q, block_table, kv_lens)
