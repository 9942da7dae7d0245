"""Vector decoding and validation, checked against torch's own conversions."""

import base64

import numpy as np
import pytest
import torch
from safetensors.torch import save

from hotwire.shared.wire import (
    ModelShape,
    VectorError,
    check_vector,
    decode_base64,
    decode_safetensors,
    read_safetensors,
)

MODEL = ModelShape(n_layers=3, hidden=8, dtype="bfloat16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_safetensors_and_base64_decode_to_torchs_float32(dtype):
    t = torch.randn(3, 8).to(dtype)
    want = t.float().numpy()
    np.testing.assert_array_equal(decode_safetensors(save({"v": t})), want)
    raw = base64.b64encode(t.contiguous().view(torch.uint8).numpy().tobytes()).decode()
    name = str(dtype).removeprefix("torch.")
    np.testing.assert_array_equal(decode_base64(raw, name, [3, 8]), want)


@pytest.mark.parametrize("call,code", [
    (lambda: decode_base64("AAAA", "int32", [1]), "bad_dtype"),
    (lambda: decode_base64("AAA", "float32", [1]), "bad_encoding"),
    (lambda: decode_base64(base64.b64encode(b"\0" * 12).decode(), "float32", [4]), "bad_shape"),
    (lambda: decode_safetensors(b"definitely not safetensors"), "bad_encoding"),
    (lambda: decode_safetensors(save({"v": torch.zeros(2, dtype=torch.int32)})), "bad_dtype"),
    (lambda: decode_safetensors(save({"a": torch.zeros(2), "b": torch.zeros(2)})), "bad_shape"),
])
def test_undecodable_uploads_name_their_problem(call, code):
    with pytest.raises(VectorError) as err:
        call()
    assert err.value.code == code


def test_check_vector_accepts_one_row_or_one_per_layer():
    assert check_vector(np.ones(8, np.float32), MODEL).shape == (1, 8)
    assert check_vector(np.ones((3, 8), np.float32), MODEL).shape == (3, 8)


@pytest.mark.parametrize("vec,code", [
    (np.ones(9, np.float32), "bad_shape"),
    (np.ones((2, 8), np.float32), "bad_shape"),
    (np.array([np.nan] + [0.0] * 7, np.float32), "not_finite"),
    (np.array([np.inf] + [0.0] * 7, np.float32), "not_finite"),
])
def test_check_vector_refuses_mismatches(vec, code):
    with pytest.raises(VectorError) as err:
        check_vector(vec, MODEL)
    assert err.value.code == code


def test_fp16_model_refuses_values_that_would_overflow():
    with pytest.raises(VectorError):
        check_vector(np.full(8, 1e6, np.float32), ModelShape(3, 8, "float16"))
    assert check_vector(np.full(8, 1e6, np.float32), MODEL).max() == 1e6


# Hardening ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**62, 4], [2**64 + 1]])
def test_a_shape_whose_element_count_overflows_is_a_bad_shape(shape):
    for data in ("", "AAAA"):
        with pytest.raises(VectorError) as err:
            decode_base64(data, "float32", shape)
        assert err.value.code == "bad_shape"


def test_long_base64_decodes_in_slices_exactly_as_in_one_go():
    values = np.random.default_rng(0).random(2**20 + 1, dtype=np.float32)  # padding at the end
    text = base64.b64encode(values.tobytes()).decode()
    assert len(text) > 4 * 2**20 and text.endswith("=")
    np.testing.assert_array_equal(decode_base64(text, "float32", [values.size]), values)
    for bad in (text[:2**20 - 4] + "AA==" + text[2**20:], text[:-1] + "*"):
        with pytest.raises(VectorError) as err:
            decode_base64(bad, "float32", [values.size])
        assert err.value.code == "bad_encoding"


def test_read_safetensors_names_the_stored_element_type():
    vector, dtype = read_safetensors(save({"v": torch.zeros(3, 8, dtype=torch.bfloat16)}))
    assert (vector.shape, vector.dtype, dtype) == ((3, 8), np.float32, "bfloat16")
