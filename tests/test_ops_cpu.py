"""The ops without a GPU: schemas, fake (meta) implementations, and every argument check,
both in the compiled op (C++, fed CPU tensors) and in the Python copy (validate.check_metadata
through ops.attention)."""


import pytest
import torch

from mla_lab.core import ops, stages
from mla_lab.measure import probes
from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.validate import InputError, check_contents, check_metadata

CUDA = stages.cuda_stages()
SPLIT = [s for s in CUDA if s.splits]

# kv_lens (5+3, 20+3) = (8, 23); pages of 16: (1, 2); table width 2 + 1 = 3; pool 3 + 2 spare = 5 pages
PROBLEM = Problem(streams=2, q_len=3, heads=2, prefix=(5, 20), page_size=16)


_BASE = None


def base_args():
    """Valid CPU arguments for PROBLEM (a fresh dict each time; the tensors are shared, never written)."""
    global _BASE
    if _BASE is None:
        w = make_workload(PROBLEM, seed=0)
        out, lse = w.new_outputs()
        _BASE = dict(q=w.q, kv=w.kv_cache, bt=w.block_table, lens=w.kv_lens, scale=w.scale, out=out, lse=lse, ns=2)
    return dict(_BASE)


def call_op(st, a):
    op = getattr(torch.ops.mla_lab, st.id)
    if st.splits:
        return op(a["q"], a["kv"], a["bt"], a["lens"], a["scale"], a["ns"], a["out"], a["lse"])
    return op(a["q"], a["kv"], a["bt"], a["lens"], a["scale"], a["out"], a["lse"])


def call_python(st, a):
    return ops.attention(st, a["q"], a["kv"], a["bt"], a["lens"], a["scale"], out=a["out"], lse=a["lse"],
                         num_splits=a["ns"])


def _misaligned(shape, offset, dtype=torch.bfloat16):
    """A view of `shape` that starts `offset` elements into each row of a wider buffer."""
    big = torch.zeros(*shape[:-1], shape[-1] + offset, dtype=dtype)
    return big[..., offset:]


# (name, change to the valid arguments, what the C++ message says, what the Python message says)
CASES = [
    ("q_dtype", lambda a: dict(a, q=a["q"].float()),
     r"q must be bfloat16, got \[2, 3, 2, 576\] Float on cpu", r"q must be bfloat16, got torch\.float32"),
    ("q_rank", lambda a: dict(a, q=a["q"][0]),
     r"q must be \[streams, q_len, heads, 576\], got \[3, 2, 576\] BFloat16 on cpu",
     r"q must be \[streams, q_len, heads, 576\], got \(3, 2, 576\) bfloat16 on cpu"),
    ("q_last_dim", lambda a: dict(a, q=a["q"][..., :512]),
     r"q must be \[streams, q_len, heads, 576\], got \[2, 3, 2, 512\] BFloat16",
     r"q must be \[streams, q_len, heads, 576\], got \(2, 3, 2, 512\) bfloat16"),
    ("empty_batch", lambda a: dict(a, q=a["q"][:0], bt=a["bt"][:0], lens=a["lens"][:0], out=a["out"][:0],
                                   lse=a["lse"][:0]),
     r"empty batch: q is \[0, 3, 2, 576\] BFloat16 on cpu; streams, q_len and heads must all be >= 1",
     r"empty batch: q is \(0, 3, 2, 576\) bfloat16 on cpu; streams, q_len and heads must all be >= 1"),
    # every other element of a 1152-wide buffer: strides (2*3*1152, 2*1152, 1152, 2) = (6912, 2304, 1152, 2)
    ("q_strided", lambda a: dict(a, q=torch.zeros(2, 3, 2, 1152, dtype=torch.bfloat16)[..., ::2]),
     r"q's last dimension must be contiguous \(stride 1\), got strides \[6912, 2304, 1152, 2\]",
     r"q's last dimension must be contiguous \(stride 1\), got strides \(6912, 2304, 1152, 2\)"),
    ("kv_strided", lambda a: dict(a, kv=torch.zeros(5, 16, 1152, dtype=torch.bfloat16)[..., ::2]),
     r"kv_cache's last dimension must be contiguous, got strides \[18432, 1152, 2\]",
     r"kv_cache's last dimension must be contiguous, got strides \(18432, 1152, 2\)"),
    ("bt_strided", lambda a: dict(a, bt=torch.zeros(2, 6, dtype=torch.int32)[:, ::2]),
     r"block_table's rows must be contiguous, got strides \[6, 2\]",
     r"block_table's rows must be contiguous, got strides \(6, 2\)"),
    # the C++ message does not say which strides came (the Python one does)
    ("lens_strided", lambda a: dict(a, lens=torch.tensor([8, 0, 23, 0], dtype=torch.int32)[::2]),
     r"kv_lens must be contiguous", r"kv_lens must be contiguous, got strides \(2,\)"),
    ("out_strided", lambda a: dict(a, out=torch.zeros(2, 3, 2, 1024, dtype=torch.bfloat16)[..., ::2]),
     r"out's last dimension must be contiguous, got strides \[6144, 2048, 1024, 2\]",
     r"out's last dimension must be contiguous, got strides \(6144, 2048, 1024, 2\)"),
    ("kv_dtype", lambda a: dict(a, kv=a["kv"].half()),
     r"kv_cache must be bfloat16, got \[5, 16, 576\] Half on cpu", r"kv_cache must be bfloat16, got torch\.float16"),
    ("kv_rank", lambda a: dict(a, kv=a["kv"][0]),
     r"kv_cache must be \[num_pages, page_size, 576\], got \[16, 576\]",
     r"kv_cache must be \[num_pages, page_size, 576\], got \(16, 576\)"),
    ("kv_empty", lambda a: dict(a, kv=a["kv"][:0]),
     r"kv_cache is empty: \[0, 16, 576\]", r"kv_cache is empty: \(0, 16, 576\)"),
    ("bt_int64", lambda a: dict(a, bt=a["bt"].long()),
     r"block_table must be int32, got \[2, 3\] Long on cpu", r"block_table must be int32, got torch\.int64"),
    ("bt_streams", lambda a: dict(a, bt=a["bt"][:1]),
     r"block_table must be \[streams=2, max_pages >= 1\], got \[1, 3\] Int",
     r"block_table must be \[streams=2, max_pages\], got \(1, 3\) int32"),
    ("bt_no_columns", lambda a: dict(a, bt=a["bt"][:, :0]),
     r"block_table must be \[streams=2, max_pages >= 1\], got \[2, 0\] Int",
     r"block_table has no columns: \(2, 0\) int32"),
    ("lens_length", lambda a: dict(a, lens=torch.tensor([8, 23, 4], dtype=torch.int32)),
     r"kv_lens must be \[streams=2\], got \[3\] Int on cpu", r"kv_lens must be \[streams=2\], got \(3,\) int32 on cpu"),
    ("lens_int64", lambda a: dict(a, lens=a["lens"].long()),
     r"kv_lens must be int32, got \[2\] Long", r"kv_lens must be int32, got torch\.int64"),
    ("out_shape", lambda a: dict(a, out=a["out"][:, :2]),
     r"out must be \[2, 3, 2, 512\] bfloat16, got \[2, 2, 2, 512\] BFloat16 on cpu",
     r"out must be \[2, 3, 2, 512\] bfloat16, got \(2, 2, 2, 512\) bfloat16 on cpu"),
    ("out_dtype", lambda a: dict(a, out=a["out"].float()),
     r"out must be \[2, 3, 2, 512\] bfloat16, got \[2, 3, 2, 512\] Float",
     r"out must be \[2, 3, 2, 512\] bfloat16, got \(2, 3, 2, 512\) float32"),
    ("lse_dtype", lambda a: dict(a, lse=a["lse"].double()),
     r"lse must be \[2, 3, 2\] float32, got \[2, 3, 2\] Double on cpu",
     r"lse must be \[2, 3, 2\] float32, got \(2, 3, 2\) float64 on cpu"),
    ("lse_shape", lambda a: dict(a, lse=a["lse"][..., :1]),
     r"lse must be \[2, 3, 2\] float32, got \[2, 3, 1\] Float", r"lse must be \[2, 3, 2\] float32, got \(2, 3, 1\) float32"),
    ("scale_nan", lambda a: dict(a, scale=float("nan")),
     r"scale must be a finite positive number, got nan", r"scale must be a finite positive number, got nan"),
    ("scale_inf", lambda a: dict(a, scale=float("inf")),
     r"scale must be a finite positive number, got inf", r"scale must be a finite positive number, got inf"),
    ("scale_zero", lambda a: dict(a, scale=0.0),
     r"scale must be a finite positive number, got 0\.0", r"scale must be a finite positive number, got 0\.0"),
    ("scale_negative", lambda a: dict(a, scale=-0.5),
     r"scale must be a finite positive number, got -0\.5", r"scale must be a finite positive number, got -0\.5"),
    # q two bytes into each row of a 577-wide buffer: neither the address nor the row stride is 4-byte aligned
    ("q_2byte_offset", lambda a: dict(a, q=_misaligned((2, 3, 2, 576), 1)),
     r"needs q, kv_cache and out to start on (4|16)-byte boundaries .* got q at address offset 2",
     r"q must start on a (4|16)-byte boundary"),
]


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
@pytest.mark.parametrize("name, change, cpp, py", CASES, ids=[c[0] for c in CASES])
def test_compiled_op_rejects(ext, st, name, change, cpp, py):
    with pytest.raises(RuntimeError, match=rf"^mla_lab::{st.id}: {cpp}"):
        call_op(st, change(base_args()))


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
@pytest.mark.parametrize("name, change, cpp, py", CASES, ids=[c[0] for c in CASES])
def test_python_path_rejects(st, name, change, cpp, py):
    with pytest.raises(InputError, match=rf"^{st.id}: {py}"):
        call_python(st, change(base_args()))


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_valid_cpu_tensors_reach_the_device_check(ext, st):
    with pytest.raises(RuntimeError) as e:
        call_op(st, base_args())
    assert str(e.value).splitlines()[0].endswith(f"mla_lab::{st.id}: runs on CUDA tensors; got tensors on cpu")
    with pytest.raises(InputError, match=rf"^{st.id}: needs cuda tensors, got tensors on cpu; without a GPU, stage "
                                         r"'triton' runs in Triton's interpreter and mla_lab.reference_attention "):
        call_python(st, base_args())


@pytest.mark.parametrize("st", SPLIT, ids=lambda s: s.id)
@pytest.mark.parametrize("ns, words", [
    (0, r"num_splits must be in 1\.\.256, got 0"),
    (257, r"num_splits must be in 1\.\.256, got 257"),
    # the range is checked before the grid's 65535 blocks in z, so the message names the range
    (10**6, r"num_splits must be in 1\.\.256, got 1000000"),
])
def test_compiled_op_rejects_num_splits(ext, st, ns, words):
    with pytest.raises(RuntimeError, match=rf"^mla_lab::{st.id}: {words}"):
        call_op(st, dict(base_args(), ns=ns))


@pytest.mark.parametrize("ns", [1, 256])
def test_num_splits_bounds_are_inclusive(ext, ns):
    for st in SPLIT:
        with pytest.raises(RuntimeError, match="runs on CUDA tensors"):
            call_op(st, dict(base_args(), ns=ns))


# ---- 16-byte stages and misaligned views ------------------------------------------

def _q_offset_by_4():
    """q starting 4 elements (8 bytes) into rows of a 580-wide buffer: 4-byte aligned, not 16."""
    return _misaligned((2, 3, 2, 576), 4)


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_q_offset_by_8_bytes(ext, st):
    a = dict(base_args(), q=_q_offset_by_4())
    assert a["q"].data_ptr() % 16 == 8 and a["q"].stride()[:-1] == (3480, 1160, 580)
    if st.align_bytes == 16:
        with pytest.raises(RuntimeError, match=rf"mla_lab::{st.id}: needs q, kv_cache and out to start on 16-byte "
                                               r"boundaries with strides that are multiples of 8 elements; got q at "
                                               r"address offset 8 with strides \[3480, 1160, 580, 1\]\. the "
                                               rf"{st.id} stage moves .* use stage warp_per_key"):
            call_op(st, a)
        with pytest.raises(InputError, match=rf"{st.id}: q must start on a 16-byte boundary"):
            call_python(st, a)
    else:  # the 4-byte stages take the view: they stop only at the device check
        with pytest.raises(RuntimeError, match="runs on CUDA tensors; got tensors on cpu"):
            call_op(st, a)
        with pytest.raises(InputError, match="needs cuda tensors"):
            call_python(st, a)


def test_16_byte_stages_check_out_and_kv_cache_too(ext):
    out = _misaligned((2, 3, 2, 512), 4)
    kv = _misaligned((5, 16, 576), 4)
    for st in ("float4", "shared_rows"):
        s = stages.get(st)
        with pytest.raises(RuntimeError, match=r"16-byte .* got out at address offset 8"):
            call_op(s, dict(base_args(), out=out))
        with pytest.raises(RuntimeError, match=r"16-byte .* got kv_cache at address offset 8"):
            call_op(s, dict(base_args(), kv=kv))
        with pytest.raises(InputError, match="out must start on a 16-byte boundary"):
            call_python(s, dict(base_args(), out=out))
        # A 16-byte aligned start with a row stride of 580 elements (not a multiple of 8) fails too.
        q = torch.zeros(2, 3, 2, 580, dtype=torch.bfloat16)[..., :576]
        assert q.data_ptr() % 16 == 0
        with pytest.raises(RuntimeError, match=r"16-byte .* got q at address offset 0 with strides \[3480"):
            call_op(s, dict(base_args(), q=q))
    with pytest.raises(RuntimeError, match="runs on CUDA tensors"):
        call_op(stages.get("warp_per_key"), dict(base_args(), out=out, kv=kv))


# ---- schemas and fake implementations ------------------------------------------------

@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_schema(ext, st):
    schema = str(getattr(torch.ops.mla_lab, st.id).default._schema)
    assert schema.startswith(f"mla_lab::{st.id}(Tensor q, Tensor kv_cache, Tensor block_table, Tensor kv_lens, "
                             "float scale, ")
    assert schema.endswith("Tensor(a!) out, Tensor(b!) lse) -> ()")
    assert ("int num_splits" in schema) == st.splits
    args = getattr(torch.ops.mla_lab, st.id).default._schema.arguments
    mutable = [a.name for a in args if a.alias_info is not None and a.alias_info.is_write]
    assert mutable == ["out", "lse"]


def _meta(a):
    m = {k: (torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    return m


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_fake_implementation(ext, st):
    ok = _meta(base_args())
    assert call_op(st, ok) is None
    # q of another width: the fake says so, as the op would
    with pytest.raises(InputError, match=rf"mla_lab::{st.id}: q must be \[streams, q_len, heads, 576\]"):
        call_op(st, dict(ok, q=torch.empty(2, 3, 2, 512, dtype=torch.bfloat16, device="meta")))
    with pytest.raises(InputError, match=rf"mla_lab::{st.id}: out must be \[2, 3, 2, 512\] bfloat16"):
        call_op(st, dict(ok, out=torch.empty(2, 4, 2, 512, dtype=torch.bfloat16, device="meta")))
    with pytest.raises(InputError, match="block_table must be int32"):
        call_op(st, dict(ok, bt=torch.empty(2, 3, dtype=torch.int64, device="meta")))
    if st.splits:
        for ns in (0, 257):
            with pytest.raises(ValueError, match=rf"num_splits must be in 1\.\.256, got {ns}"):
                call_op(st, dict(ok, ns=ns))


# ---- the Python checks alone ------------------------------------------------------------

def test_check_metadata_extras():
    a = base_args()
    args = (a["q"], a["kv"], a["bt"], a["lens"], a["scale"])
    check_metadata(*args, a["out"], a["lse"], device_type=None)  # valid on any device
    with pytest.raises(InputError, match="needs cuda tensors, got tensors on cpu"):
        check_metadata(*args)
    with pytest.raises(InputError, match="q must be a torch.Tensor, got list"):
        check_metadata([1, 2], *args[1:])
    with pytest.raises(InputError, match=r"all tensors must be on one device, got \['cpu', 'meta'\]"):
        check_metadata(*args, torch.empty_like(a["out"], device="meta"), device_type=None)
    with pytest.raises(InputError, match="scale must be a finite positive number, got '1'"):
        check_metadata(*args[:4], "1", device_type=None)
    with pytest.raises(InputError, match="kv_lens must be contiguous"):
        check_metadata(a["q"], a["kv"], a["bt"], torch.tensor([8, 0, 23, 0], dtype=torch.int32)[::2], a["scale"],
                       device_type=None)
    # name= prefixes the message
    with pytest.raises(InputError, match=r"^mine: q must be bfloat16"):
        check_metadata(a["q"].float(), *args[1:], device_type=None, name="mine")


def test_check_contents_cases():
    a = base_args()
    q, kv, bt, lens = a["q"], a["kv"], a["bt"], a["lens"]
    check_contents(q, kv, bt, lens)  # valid
    # two bad streams: the first is named
    with pytest.raises(InputError, match=r"stream 0 has kv_len 2 < q_len 3"):
        check_contents(q, kv, bt, torch.tensor([2, 1], dtype=torch.int32))
    # capacity: 3 columns x 16 = 48 tokens
    check_contents(q, kv, bt.clone().fill_(0), torch.tensor([48, 3], dtype=torch.int32))
    with pytest.raises(InputError, match=r"stream 1 has kv_len 49, beyond its block table's capacity 3 pages x 16 = 48"):
        check_contents(q, kv, bt, torch.tensor([8, 49], dtype=torch.int32))
    # stream 1 uses 2 pages (23 tokens); slot 1 is its second
    bad = bt.clone()
    bad[1, 1] = 5  # the pool is pages 0 .. 4
    with pytest.raises(InputError, match=r"^x: block_table\[1, 1\] = 5 is not a page of the pool \(0 \.\. 4\)$"):
        check_contents(q, kv, bad, lens, name="x")
    bad[1, 1] = -2
    with pytest.raises(InputError, match=r"block_table\[1, 1\] = -2 is not a page"):
        check_contents(q, kv, bad, lens)
    # its third slot is unused and holds the poison id: not checked
    assert int(bt[1, 2]) == 1 << 30
    check_contents(q, kv, bt, lens)


# ---- ops.attention's split count ----------------------------------------------------------

def _spy_on_per_head(monkeypatch):
    """Replace the compiled per_head op by a recorder of the num_splits it is given."""
    seen = []
    monkeypatch.setattr(torch.ops.mla_lab, "per_head", lambda *args: seen.append(args[5]))
    monkeypatch.setattr(ops, "default_num_splits", lambda *args: 5)  # needs a GPU otherwise
    return seen


def test_attention_passes_num_splits_through(ext, monkeypatch):
    seen = _spy_on_per_head(monkeypatch)
    a = base_args()
    ops.attention("per_head", a["q"], a["kv"], a["bt"], a["lens"], a["scale"], num_splits=3, check=False)
    ops.attention("per_head", a["q"], a["kv"], a["bt"], a["lens"], a["scale"], check=False)
    assert seen == [3, 5]  # given, then the stage's rule


def test_attention_rejects_zero_splits(ext, monkeypatch):
    seen = _spy_on_per_head(monkeypatch)
    a = base_args()
    with pytest.raises(ValueError, match="num_splits"):
        ops.attention("per_head", a["q"], a["kv"], a["bt"], a["lens"], a["scale"], num_splits=0, check=False)
    assert seen == []


def test_float4_reads_probe_checks_like_float4(ext):
    """The probe takes float4's checks: the same messages, the device check last."""
    a = base_args()
    sink = torch.zeros(64, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"mla_lab::float4: runs on CUDA tensors; got tensors on cpu"):
        ext.probe_float4_reads(a["q"], a["kv"], a["bt"], a["lens"], 2, sink)
    with pytest.raises(RuntimeError, match=r"mla_lab::float4: num_splits must be in 1\.\.256, got 0"):
        ext.probe_float4_reads(a["q"], a["kv"], a["bt"], a["lens"], 0, sink)
    with pytest.raises(RuntimeError, match=r"mla_lab::float4: kv_cache must be bfloat16"):
        ext.probe_float4_reads(a["q"], a["kv"].float(), a["bt"], a["lens"], 2, sink)


def test_probe_runner_names_its_probes():
    with pytest.raises(KeyError, match="no probe 'float5_reads'; probes are float4_reads"):
        probes.probe_runner("float5_reads", None)
