"""Quantized variants (``serving.variants``): the names a sweep takes, the CPU flags vLLM's CPU build needs for
each, the checkpoint as shipped served from where it is, and a failed quantization reported with the tool's own
lines. Each variant made and served (its answers and accuracy against the reference): the demo model's whole
adaptation in tests/test_browser_make_run.py."""

import pytest

from workers.engine.serving.variants import VariantFailed, check_variants, missing_cpu_flags, prepare_variant

def test_it_takes_known_variants_once_each():
    assert check_variants(["as_shipped", "w8a8-int8"]) == ["as_shipped", "w8a8-int8"]
    with pytest.raises(ValueError, match="unknown variants: w3; known: as_shipped, w8a8-int8"):
        check_variants(["w3"])
    with pytest.raises(ValueError, match="more than once: w4a16"):
        check_variants(["w4a16", "w4a16"])
    with pytest.raises(ValueError, match="non-empty list"):
        check_variants("w4a16")


def test_it_names_the_cpu_flags_a_variant_needs_that_the_cpu_lacks(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert missing_cpu_flags("w4a16", tmp_path / "cpuinfo") == ["avx512f"]
    assert missing_cpu_flags("w4a8-int", tmp_path / "cpuinfo") == []
    assert missing_cpu_flags("w4a16", tmp_path / "absent") == []


def test_the_checkpoint_as_shipped_is_served_from_where_it_is(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"0" * 10)
    variant = prepare_variant("as_shipped", checkpoint=tmp_path, engine_python="unused", out=tmp_path / "x")
    assert variant == {"name": "as_shipped", "path": str(tmp_path), "settings": {}, "bits": None,
                       "method": "as shipped", "made_by": "as shipped", "seconds": 0.0, "disk_bytes": 10,
                       "threshold": None}


@pytest.mark.slow
def test_a_failed_quantization_says_what_the_tool_said(tmp_path, vllm_python):
    with pytest.raises(VariantFailed, match=r"making w8a8-int8 failed \(exit 1\)(.|\n)*not-a-checkpoint"):
        prepare_variant("w8a8-int8", checkpoint=tmp_path / "not-a-checkpoint", engine_python=vllm_python,
                        out=tmp_path / "out")
