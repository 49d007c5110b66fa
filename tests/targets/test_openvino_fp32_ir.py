"""An intel-cpu FP32 IR carries its precision inside the IR (issue 32): a user loading model.xml with
OpenVINO's defaults on a CPU whose default is bf16 (AMX / AVX512-BF16) or f16 (ARM) must get FP32 too.
OpenVINO 2026.4's CPU plugin does not apply INFERENCE_PRECISION_HINT from the IR's rt_info, so every
layer is marked ``precise`` (DisablePrecisionConversion, which keeps a node at its original precision).
This host's CPU runs f32 anyway, so the mark is proven by what OpenVINO itself does with it: read back,
and an FP16 compression of the read-back IR leaves the marked weights FP32."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import edgeopt

ov = pytest.importorskip("openvino")


def test_fp32_ir_layers_keep_fp32_under_openvino_precision_conversion(tiny_model, tmp_path):
    rep = edgeopt.build(str(tiny_model), "intel-cpu", precision="fp32", dist=tmp_path / "d", jobs=1)
    bundle = rep.results[0].bundle
    model = ov.Core().read_model(f"{bundle}/model.xml")
    ops = list(model.get_ops())
    assert all("DisablePrecisionConversion_0" in dict(n.get_rt_info()) for n in ops)
    assert model.get_rt_info(["runtime_options", "INFERENCE_PRECISION_HINT"]).astype(str) == "f32"
    def weight_types(m, name):  # Const element types once OpenVINO compresses the IR to FP16
        ov.save_model(m, str(tmp_path / name), compress_to_fp16=True)
        return set(re.findall(r'type="Const"[^>]*>\s*(?:<rt_info>.*?</rt_info>\s*)?<data element_type="(\w+)"',
                              (tmp_path / name).read_text(), re.S))

    assert "f32" in weight_types(model, "marked.xml") and "f16" not in weight_types(model, "marked.xml")
    # the control: the same IR without the marks is compressed (so the assertion above can fail)
    (tmp_path / "bare.xml").write_text(re.sub(r'<attribute name="precise" version="0" ?/>', "",
                                              Path(f"{bundle}/model.xml").read_text()))
    shutil.copy(f"{bundle}/model.bin", tmp_path / "bare.bin")
    assert "f16" in weight_types(ov.Core().read_model(str(tmp_path / "bare.xml")), "bare_fp16.xml")
    assert rep.results[0].manifest["options"]["ir_precision"].startswith("FP32 kept inside the IR")
