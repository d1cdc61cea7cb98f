"""Speculative decoding's bookkeeping, run for many steps and checked at every one.

Each step of a speculative decoder verifies ``q_len`` tokens per stream (the
last accepted token and a draft), appends their latent rows to the cache after
the stream's committed length, and then learns how many of them the target
model accepts.  The accepted rows stay; the rest are rolled back by the length
alone, and the next step's rows overwrite them.  Mistakes here are silent: a
stale row left visible, a row written one slot off, or a page given to two
streams changes the answer by a fraction of a percent.

:func:`acceptance_loop` runs the model step (:mod:`mla_lab.serving.model_step`) for
many steps with random acceptance and checks, at every step:

* the lengths the kernels are given are the committed lengths plus the draft;
* every layer's cache, read through the block table up to each stream's
  length, equals, bit for bit, the rows the model produced and kept (a shadow
  copy held apart from the pool);
* the step's output matches a plain fp32 implementation of the same layers
  (no absorption, no pages) that keeps its own history.

With ``defrag_every`` it also defragments the pool now and then and checks the
cache again right after.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from .model_step import SMALL, MLAConfig, ModelStep, random_weights, reference_layer
from ..core.paging import PageTable, gather_stream


@dataclass
class LoopReport:
    stage: str
    steps: int
    streams: int
    bucket_streams: int
    q_len: int
    graph: bool
    appended: int = 0  # rows written by the steps
    accepted: int = 0  # of which kept
    cache_checks: int = 0  # (layer, stream) comparisons of the cache with the shadow, all exact
    defrags: int = 0
    max_rel_err: float = 0.0  # of each step's layer output against the fp32 implementation
    final_lengths: list = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.stage}: {self.steps} steps, {self.streams} streams in a bucket of {self.bucket_streams}, "
                f"q_len {self.q_len}, {'graph replay' if self.graph else 'eager'}: {self.accepted} of "
                f"{self.appended} appended rows accepted, {self.cache_checks} cache checks exact, "
                f"{self.defrags} defragmentations, worst error against fp32 {self.max_rel_err:.1e}")


def acceptance_loop(attend, *, cfg: MLAConfig = SMALL, steps: int = 100, streams: int = 3,
                    bucket_streams: int | None = None, q_len: int = 4, prefix=(5, 40, 17), page_size: int = 16,
                    device="cpu", seed: int = 0, graph: bool = False, defrag_every: int = 0,
                    tol: float = 3e-2) -> LoopReport:
    """Run ``steps`` verify steps with random acceptance; raise AssertionError at the first wrong one.

    ``attend`` is a stage id or an attention function
    (:func:`mla_lab.serving.model_step.reference_attend` on a CPU).  ``prefix``: each
    stream's tokens before the first step (random rows).
    """
    rng = random.Random(seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    bucket = bucket_streams or streams
    name = attend if isinstance(attend, str) else getattr(attend, "stage", getattr(attend, "__name__", "attend"))
    report = LoopReport(stage=name, steps=steps, streams=streams, bucket_streams=bucket, q_len=q_len, graph=graph)
    T, L = q_len, cfg.layers

    most = max(prefix) + (steps + 1) * T
    max_pages = -(-most // page_size)
    table = PageTable(1 + streams * max_pages + 2, page_size, max_pages, streams, scatter_seed=seed)
    cache = torch.full((L, table.num_pages, page_size, 576), float("nan"), dtype=torch.bfloat16, device=device)
    weights = random_weights(cfg, device=device, seed=seed)
    weights32 = [w.to(torch.float32, "cpu") for w in weights]

    # The prompts: random rows, written through the table, kept in the shadow and the fp32 history.
    shadow = [[None] * streams for _ in range(L)]
    history = [[None] * streams for _ in range(L)]
    for b, n in enumerate(prefix):
        table.add_prefix(b, n)
        for i in range(L):
            rows = torch.randn(n, 576, generator=gen).to(torch.bfloat16)
            pos = torch.arange(n)
            ids = torch.tensor(table.pages[b], dtype=torch.long)[pos // page_size] if n else pos
            cache[i].view(-1, 576)[(ids * page_size + pos % page_size).to(device)] = rows.to(device)
            shadow[i][b], history[i][b] = rows, rows.float()

    step = ModelStep(cfg, weights, cache, attend, streams=bucket, q_len=T, max_pages=max_pages, record_rows=True)

    def check_cache(lengths):
        for i in range(L):
            for b in range(streams):
                got = gather_stream(cache[i], table.pages[b], lengths[b]).cpu()
                want = shadow[i][b]
                if not torch.equal(got, want):
                    bad = (got != want).any(-1).nonzero().flatten()[:5].tolist()
                    raise AssertionError(f"{name}: layer {i}, stream {b}: cache rows {bad} differ from the rows "
                                         f"the model kept (length {lengths[b]})")
                report.cache_checks += 1

    for s in range(steps):
        lengths = list(table.lengths)
        kv_lens = table.begin_step(T)
        assert kv_lens == [n + T for n in lengths], (kv_lens, lengths)
        x = torch.randn(streams * T, cfg.hidden, generator=gen).to(torch.bfloat16)
        args = (x.to(device), table.block_table(device), table.kv_lens(device))
        if graph:
            y = step(*args)
        else:
            y = step.eager(*args)
        y = y.float().cpu()
        rows = step.rows[:, :streams * T].cpu()
        report.appended += streams * T

        # the fp32 model, layer by layer, on its own history
        x_ref = x.float()
        new_history = []
        for i in range(L):
            x_ref, h = reference_layer(x_ref, weights32[i], cfg, history[i], T)
            new_history.append(h)
        delta, delta_ref = y - x.float(), x_ref - x.float()
        err = ((delta - delta_ref).norm() / delta_ref.norm()).item()
        report.max_rel_err = max(report.max_rel_err, err)
        if not err <= tol:
            raise AssertionError(f"{name}: step {s}: relative error {err:.2e} against the fp32 layers > {tol}")

        # the cache holds the kept rows and this step's rows, in order
        for i in range(L):
            for b in range(streams):
                shadow[i][b] = torch.cat([shadow[i][b], rows[i, b * T:(b + 1) * T]])
        check_cache(kv_lens)

        keep = [rng.randint(1, T) for _ in range(streams)]
        table.accept(keep)
        report.accepted += sum(keep)
        for i in range(L):
            for b in range(streams):
                shadow[i][b] = shadow[i][b][:table.lengths[b]]
                history[i][b] = new_history[i][b][:table.lengths[b]]
        if defrag_every and (s + 1) % defrag_every == 0:
            table.trim()
            table.defragment(cache)
            assert table.is_contiguous()
            report.defrags += 1
            check_cache(table.lengths)
    report.final_lengths = list(table.lengths)
    return report
