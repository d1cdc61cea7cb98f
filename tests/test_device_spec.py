"""Which row of the device table a GPU gets (roofline.device_spec_for): its own, or none with a note."""

import pytest
import torch

from mla_lab.measure import roofline
from mla_lab.core.problem import Problem
from mla_lab.measure.roofline import DEVICES, device_spec_for, device_spec_for_current_gpu


@pytest.mark.parametrize("name, cc, sms, key", [
    ("NVIDIA H200", (9, 0), 132, "h200"),
    ("NVIDIA H100 80GB HBM3", (9, 0), 132, "h100"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 188, "rtx_pro_6000"),
])
def test_a_listed_gpu_gets_its_own_entry(name, cc, sms, key):
    spec, note = device_spec_for(name, cc, sms)
    assert spec is DEVICES[key]
    assert note.startswith(f"{name} (sm_{cc[0]}{cc[1]}, {sms} SMs): datasheet figures") and f"'{key}'" in note


@pytest.mark.parametrize("name, cc, sms, says", [
    ("NVIDIA A100-SXM4-80GB", (8, 0), 108, "is not in mla_lab.measure.roofline.DEVICES"),
    ("NVIDIA GeForce RTX 4090", (8, 9), 128, "is not in mla_lab.measure.roofline.DEVICES"),
    # an H100 PCIe has 114 SMs: not the table's H100 SXM, so none of its figures
    ("NVIDIA H100 PCIe", (9, 0), 114, "is not the table's 'h100' (NVIDIA H100 SXM: sm_90, 132 SMs)"),
    ("NVIDIA H200 NVL", (9, 0), 132, None),  # same SMs and arch: the H200 entry (the note says which)
])
def test_another_gpu_gets_no_figures(name, cc, sms, says):
    spec, note = device_spec_for(name, cc, sms)
    if says is None:
        assert spec is DEVICES["h200"] and "'h200'" in note
        return
    assert spec is None
    assert says in note and "floors use only the ceilings measured on it" in note


def test_current_gpu():
    spec, note = device_spec_for_current_gpu()
    if not torch.cuda.is_available():
        assert spec is None and note == "no CUDA GPU here: no device to look up"
    else:
        p = torch.cuda.get_device_properties(0)
        assert note.startswith(f"{p.name} (sm_{p.major}{p.minor}")


def test_floor_without_an_entry_needs_every_rate():
    p = Problem(streams=1, q_len=9, heads=8, prefix=1024, page_size=1)
    with pytest.raises(ValueError, match="needs measured bandwidth, matrix_rate and fp32_rate"):
        roofline.floor(p, None, bandwidth=3e12, matrix_rate=600e12)
    f = roofline.floor(p, None, bandwidth=3e12, matrix_rate=600e12, fp32_rate=50e12)
    assert f.memory_us == pytest.approx(roofline.min_bytes(p) / 3e12 * 1e6)
    assert f.cuda_core_us == pytest.approx(roofline.flops(p) / 50e12 * 1e6)
    # with an entry, a measured fp32 rate replaces the datasheet's
    g = roofline.floor(p, "h200", fp32_rate=50e12)
    assert g.cuda_core_us == f.cuda_core_us and g.memory_us == roofline.floor(p, "h200").memory_us
