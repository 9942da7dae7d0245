"""Which mailbox rows a vector gets on an engine (control_api.slots.placement): one per armed
layer, one for every layer, or the layers asked for; read back out of a real mailbox.
"""

from __future__ import annotations

import numpy as np
import pytest

from hotwire.shared.mailbox import ANY_LAYER

from control_harness import FP, Rig, exact_vector, safetensors_blob

H = FP.hidden


def test_json_upload_of_per_layer_vector_fills_one_slot_per_armed_layer(rig):
    vector = exact_vector(FP.n_layers, H, seed=1)
    r = rig.push("per_layer", vector, metadata={"source": "test"})
    assert r.status_code == 201, r.text
    info = r.json()
    assert (info["generation"], info["shape"], info["dtype"]) == (1, [FP.n_layers, H], "float32")
    assert info["resident"] and info["state"] == "resident"
    assert info["metadata"] == {"source": "test"} and info["layers"] is None

    entries = rig.engine.entries("per_layer")
    assert sorted(entries) == list(range(FP.n_layers))
    for layer, (_, gen, row) in entries.items():
        assert gen == 1
        np.testing.assert_array_equal(row, vector[layer])
    assert sorted((s["slot"], s["layer"]) for s in info["slots"]) == \
        sorted((slot, layer) for layer, (slot, _, _) in entries.items())


def test_one_dim_vector_takes_a_single_any_layer_slot(rig):
    vector = exact_vector(H, seed=2)
    r = rig.push("anywhere", vector)
    assert r.status_code == 201, r.text
    entries = rig.engine.entries("anywhere")
    assert list(entries) == [ANY_LAYER]
    np.testing.assert_array_equal(entries[ANY_LAYER][2], vector)
    assert [s["layer"] for s in r.json()["slots"]] == [None]


@pytest.mark.parametrize("layers_field", ["[1, 3]", "3,1"])
def test_layers_subset_materialises_only_those_rows(rig, layers_field):
    vector = exact_vector(FP.n_layers, H, seed=6)
    r = rig.upload("subset", safetensors_blob({"v": ("F32", vector)}), layers=layers_field)
    assert r.status_code == 201, r.text
    assert r.json()["layers"] == [1, 3]
    entries = rig.engine.entries("subset")
    assert sorted(entries) == [1, 3]
    for layer in (1, 3):
        np.testing.assert_array_equal(entries[layer][2], vector[layer])


def test_default_layers_follow_what_the_engine_armed(tmp_path):
    rig = Rig(tmp_path)
    rig.start_engine(armed=(0, 2))
    rig.start_api()
    try:
        vector = exact_vector(FP.n_layers, H, seed=7)
        assert rig.push("armed_only", vector).status_code == 201
        assert sorted(rig.engine.entries("armed_only")) == [0, 2]
        r = rig.push("unarmed", vector, layers=[1])
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_layers"
        assert "not armed" in r.json()["error"]["message"]
    finally:
        rig.stop()
