"""Importers (:mod:`hotwire.shared.importers`): brainscope exports, hidden-directions
dictionaries, GGUF control vectors and plain vector files.

Files are written here the way each tool writes them (``torch.save`` tensors and a
``manifest.json``; GGUF with ``gguf.GGUFWriter``, as repeng does). The layer mapping of every
format is checked against a transformers forward of a tiny random Qwen3: the source tool's own
steering (as its code does it) and hotwire's reading of the imported preset give the same
logits, and a mapping one layer off does not. The ``hotwire vectors import`` CLI and the engine's
startup loader run on the same files, against a real control API and mailbox.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from hotwire.control_api.cli.exit_codes import EXIT_CONFLICT, EXIT_ERROR, EXIT_FILE, EXIT_OK, EXIT_USAGE
from hotwire.control_api.cli.main import main
from hotwire.engine_plugin.startup import load_dir
from hotwire.shared.importers import VectorImportError, import_path
from hotwire.shared.mailbox import ANY_LAYER
from hotwire.shared.spec import parse_spec
from hotwire.shared.wire import ModelShape, encode_safetensors

from conftest import HIDDEN, LAYERS
from control_harness import FP, TOKEN, Rig, exact_vector, safetensors_blob

PROMPT = [[3, 17, 42, 99, 7, 250, 11]]


# Writers: the formats as their tools write them -------------------------------------------


def write_brainscope(root: Path, vectors: dict[str, np.ndarray],
                     passports: dict[str, dict] | None = None, model: str = "tiny-qwen3") -> Path:
    """A brainscope export: ``<name>.pt`` float32 tensors and its manifest with passports."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, vector in vectors.items():
        torch.save(torch.from_numpy(vector), root / f"{name}.pt")
        norms = np.linalg.norm(vector.reshape(-1, vector.shape[-1]), axis=1)
        entries.append({
            "name": name, "file": f"{name}.pt", "shape": list(vector.shape),
            "norm_min": round(float(norms.min()), 4), "norm_max": round(float(norms.max()), 4),
            "unit_norm": False, "model": model, "source": "dirs.json",
            **(passports or {}).get(name, {}),
            "calibration_regime": {"backend": "brainscope", "note": "steers generation",
                                   "decode_only_recommended": True}})
    manifest = {"exported_at": "2026-05-01T10:00:00+00:00", "vectors": entries}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root


def write_hidden_directions(root: Path, vectors: dict[str, np.ndarray],
                            recommended: dict[str, tuple[int | None, float | None]]) -> Path:
    """A hidden-directions dictionary: bfloat16 ``[n_layers, hidden]`` tensors and a manifest."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, vector in vectors.items():
        torch.save(torch.from_numpy(vector).to(torch.bfloat16), root / f"{name}.pt")
        layer, alpha = recommended.get(name, (None, None))
        entries.append({"name": name, "shape": list(vector.shape), "dtype": "torch.bfloat16",
                        "recommended_layer": layer, "recommended_alpha": alpha})
    manifest = {"model": "tiny-qwen3", "extracted_via": "hidden-directions CLI",
                "directions": entries, "preset_provenance": "layer sweep 0-3"}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


def write_gguf(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """A control vector as repeng exports one: arch ``controlvector``, its two keys, tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "qwen3")
    writer.add_uint32("controlvector.layer_count", len(tensors))
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def bf16(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values).to(torch.bfloat16).float().numpy()


def only(result):
    assert result.problems == []
    return {v.id: v for v in result.vectors}


# Formats -----------------------------------------------------------------------------------


def test_brainscope_export_keeps_the_passport_and_makes_a_preset(tmp_path):
    calm, per_layer = rand(HIDDEN, seed=1), rand(LAYERS, HIDDEN, seed=2)
    passport = {"calibrated": {"layer": 2, "scale": 3, "decode_only": False},
                "eval": {"violations": "0/16"}, "recipe": "recipes/calm.json"}
    root = write_brainscope(tmp_path / "export", {"calm": calm, "formal": per_layer},
                            {"calm": passport})
    vectors = only(import_path(root, n_layers=LAYERS))
    assert sorted(vectors) == ["calm", "formal"]
    np.testing.assert_array_equal(vectors["calm"].tensor, calm)
    np.testing.assert_array_equal(vectors["formal"].tensor, per_layer)
    meta = vectors["calm"].metadata
    assert meta["imported_from"] == "brainscope" and meta["exported_at"].startswith("2026-05-01")
    assert meta["calibrated"] == passport["calibrated"] and meta["eval"] == {"violations": "0/16"}
    assert meta["calibration_regime"]["decode_only_recommended"] is True
    assert vectors["calm"].layers is None
    assert vectors["calm"].preset.entries == (
        {"id": "calm", "layer": 2, "scale": 3.0, "decode_only": False},)
    assert "layer 2, scale 3" in vectors["calm"].preset.description
    assert vectors["formal"].preset is None  # no calibrated passport, no preset


def test_brainscope_decode_only_defaults_to_the_regime(tmp_path):
    root = write_brainscope(tmp_path / "export", {"calm": rand(HIDDEN, seed=3)},
                            {"calm": {"calibrated": {"layer": 1, "scale": -2.5}}})
    [entry] = only(import_path(root))["calm"].preset.entries
    assert entry == {"id": "calm", "layer": 1, "scale": -2.5, "decode_only": True}


def test_hidden_directions_dictionary(tmp_path):
    pref, inst = rand(LAYERS, HIDDEN, seed=4), rand(LAYERS, HIDDEN, seed=5)
    root = write_hidden_directions(tmp_path / "dict", {"v_pref_calm": pref, "v_inst": inst},
                                   {"v_pref_calm": (2, 1.5)})
    vectors = only(import_path(root, n_layers=LAYERS))
    assert vectors["v_pref_calm"].tensor.dtype == np.float32
    np.testing.assert_array_equal(vectors["v_pref_calm"].tensor, bf16(pref))
    assert vectors["v_pref_calm"].preset.entries == ({"id": "v_pref_calm", "layer": 2, "scale": 1.5},)
    assert vectors["v_inst"].preset is None  # no recommended_layer
    meta = vectors["v_pref_calm"].metadata
    assert (meta["imported_from"], meta["model"], meta["recommended_layer"]) == \
        ("hidden-directions", "tiny-qwen3", 2)
    assert meta["preset_provenance"] == "layer sweep 0-3"


def test_gguf_control_vector(tmp_path):
    rows = {n: rand(HIDDEN, seed=10 + n) for n in (1, 3)}
    path = write_gguf(tmp_path / "happy.gguf", {f"direction.{n}": r for n, r in rows.items()})
    [vector] = import_path(path, n_layers=LAYERS).vectors
    assert vector.id == "happy" and vector.tensor.shape == (LAYERS, HIDDEN)
    np.testing.assert_array_equal(vector.tensor[1], rows[1])
    np.testing.assert_array_equal(vector.tensor[3], rows[3])
    assert not vector.tensor[[0, 2]].any()  # layers it has no direction for stay zero
    assert vector.layers == (1, 3)
    assert vector.preset.entries == ({"id": "happy", "layers": [1, 3], "scale": 1.0},)
    assert vector.metadata == {"imported_from": "gguf", "file": "happy.gguf",
                               "general.architecture": "controlvector",
                               "controlvector.model_hint": "qwen3",
                               "controlvector.layer_count": 2}


def test_a_directory_imports_unlisted_files_as_plain_vectors_and_prefixes_ids(tmp_path):
    root = write_brainscope(tmp_path / "export", {"calm": rand(HIDDEN, seed=6)},
                            {"calm": {"calibrated": {"layer": 0, "scale": 1}}})
    (root / "extra.safetensors").write_bytes(encode_safetensors(rand(HIDDEN, seed=7)))
    write_gguf(root / "cv.gguf", {"direction.2": rand(HIDDEN, seed=8)})
    (root / "notes.txt").write_text("not a vector")
    vectors = only(import_path(root, n_layers=LAYERS, id_prefix="q3."))
    assert sorted(vectors) == ["q3.calm", "q3.cv", "q3.extra"]
    assert vectors["q3.calm"].preset.entries[0]["id"] == "q3.calm"
    assert vectors["q3.cv"].preset.entries[0]["id"] == "q3.cv"
    assert vectors["q3.extra"].preset is None
    assert vectors["q3.extra"].metadata == {"imported_from": "safetensors", "file": "extra.safetensors"}


def test_imported_presets_parse_as_specs(tmp_path):
    root = write_brainscope(tmp_path / "export", {"calm": rand(HIDDEN, seed=9)},
                            {"calm": {"calibrated": {"layer": 3, "scale": 2}}})
    write_gguf(root / "cv.gguf", {f"direction.{n}": rand(HIDDEN, seed=n) for n in (1, 2, 3)})
    for vector in import_path(root, n_layers=LAYERS).vectors:
        [entry] = parse_spec(list(vector.preset.entries))
        assert entry.id == vector.id


# Bad inputs: refused with the file and the reason ------------------------------------------


def failure(path: Path, n_layers: int | None = LAYERS) -> str:
    """What importing ``path`` says is wrong: the error, or its problem lines."""
    try:
        result = import_path(path, n_layers=n_layers)
    except VectorImportError as e:
        return str(e)
    assert result.problems, "no problem reported"
    return "\n".join(result.problems)


def _manifest(root: Path, text: str) -> Path:
    root.mkdir()
    (root / "manifest.json").write_text(text)
    return root


def _brainscope_with(root: Path, tensor, passport: dict | None = None, name: str = "v") -> Path:
    write_brainscope(root, {name: rand(HIDDEN, seed=0)}, {name: passport or {}})
    torch.save(tensor, root / f"{name}.pt")
    return root


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _brainscope_and(root: Path, extra: str, data: bytes) -> Path:
    """A one-vector export ``v``, plus the file ``extra`` holding ``data``."""
    _brainscope_with(root, torch.ones(HIDDEN))
    _written(root / extra, data)
    return root


BAD = {  # case -> (writer of the bad input under tmp_path, a piece of the message)
    "manifest not json": (lambda t: _manifest(t / "d", "{nope"), "not valid JSON"),
    "manifest with NaN": (lambda t: _manifest(t / "d", '{"vectors": [], "x": NaN}'),
                          "NaN is not a JSON number"),
    "unknown manifest": (lambda t: _manifest(t / "d", '{"items": []}'),
                         "neither a brainscope export"),
    "listed file missing": (lambda t: _manifest(t / "d", json.dumps(
        {"vectors": [{"name": "gone", "file": "gone.pt"}]})), "gone.pt: listed in manifest.json but missing"),
    "file outside the export": (lambda t: _manifest(t / "d", json.dumps(
        {"vectors": [{"name": "x", "file": "../x.pt"}]})), "must be a .pt file in the export"),
    "pt holds a dict": (lambda t: _brainscope_with(t / "d", {"v": torch.ones(HIDDEN)}),
                        "holds dict, not a float tensor"),
    "pt holds ints": (lambda t: _brainscope_with(t / "d", torch.ones(HIDDEN, dtype=torch.int32)),
                      "torch.int32 tensor, not a float tensor"),
    "pt is 3-D": (lambda t: _brainscope_with(t / "d", torch.ones(2, LAYERS, HIDDEN)),
                  "is neither [hidden] nor [n_layers, hidden]"),
    "pt has NaN": (lambda t: _brainscope_with(t / "d", torch.full((HIDDEN,), float("nan"))),
                   "NaN or infinite"),
    "pt is not a pickle": (lambda t: _brainscope_and(t / "d", "v.pt", b"junk"),
                           "not a tensor file torch can load safely"),
    "passport without layer": (lambda t: _brainscope_with(t / "d", torch.ones(HIDDEN),
                                                          {"calibrated": {"scale": 2}}),
                               "calibrated.layer must be a decoder layer"),
    "passport layer as text": (lambda t: _brainscope_with(t / "d", torch.ones(HIDDEN),
                                                          {"calibrated": {"layer": "20", "scale": 2}}),
                               "got '20'"),
    "passport scale overflows": (lambda t: _brainscope_with(t / "d", torch.ones(HIDDEN),
                                                            {"calibrated": {"layer": 1, "scale": 1e39}}),
                                 "calibrated.scale 1e+39 is not finite in float32"),
    "stem is not an id": (lambda t: _brainscope_with(t / "d", torch.ones(HIDDEN), name="calm down"),
                          "'calm down' is not a valid vector id"),
    "rows do not match the model": (lambda t: write_hidden_directions(
        t / "d", {"v": rand(LAYERS - 1, HIDDEN, seed=0)}, {}), "3 rows, but the model has 4 layers"),
    "recommended layer negative": (lambda t: write_hidden_directions(
        t / "d", {"v": rand(LAYERS, HIDDEN, seed=0)}, {"v": (-1, 1.0)}),
        "recommended_layer must be a decoder layer"),
    "two files, one id": (lambda t: _brainscope_and(t / "d", "v.safetensors", encode_safetensors(
        np.ones(HIDDEN, np.float32))), "given by more than one file"),
    "gguf direction.0": (lambda t: write_gguf(t / "x.gguf", {"direction.0": rand(HIDDEN, seed=0)}),
                         "direction.0 is invalid"),
    "gguf other tensor": (lambda t: write_gguf(t / "x.gguf", {"direction.1": rand(HIDDEN, seed=0),
                                                              "steer.2": rand(HIDDEN, seed=1)}),
                          "tensor 'steer.2' is not named direction.<layer>"),
    "gguf f16": (lambda t: write_gguf(t / "x.gguf", {"direction.1": np.ones(HIDDEN, np.float16)}),
                 "is F16; llama.cpp reads F32 directions only"),
    "gguf 2-D": (lambda t: write_gguf(t / "x.gguf", {"direction.1": rand(2, HIDDEN, seed=0)}),
                 "a direction is 1-D"),
    "gguf beyond the model": (lambda t: write_gguf(t / "x.gguf", {f"direction.{LAYERS}":
                                                                  rand(HIDDEN, seed=0)}),
                              "names layer 4, but the model has 4"),
    "gguf unequal lengths": (lambda t: write_gguf(t / "x.gguf", {
        "direction.1": rand(HIDDEN, seed=0), "direction.2": rand(HIDDEN // 2, seed=1)}),
        "direction.2 has 64 values, the others 128"),
    "gguf empty": (lambda t: write_gguf(t / "x.gguf", {}), "no direction.<layer> tensors"),
    "gguf junk": (lambda t: _written(t / "x.gguf", b"GGUFjunk"), "not a readable GGUF file"),
    "nothing there": (lambda t: t / "missing", "no such file or directory"),
    "a file that is no source": (lambda t: _written(t / "v.txt", b"x"), "expected a directory"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_are_named_with_the_reason(tmp_path, case):
    make, piece = BAD[case]
    message = failure(make(tmp_path))
    assert piece in message, message
    assert str(tmp_path) in message  # it names the file


def test_gguf_needs_the_layer_count(tmp_path):
    path = write_gguf(tmp_path / "cv.gguf", {"direction.1": rand(HIDDEN, seed=0)})
    assert "needs the model's layer count" in failure(path, n_layers=None)


def test_a_bad_item_does_not_stop_the_others(tmp_path):
    root = write_brainscope(tmp_path / "export", {"good": rand(HIDDEN, seed=1),
                                                  "bad": rand(HIDDEN, seed=2)})
    torch.save({"not": "a tensor"}, root / "bad.pt")
    result = import_path(root)
    assert [v.id for v in result.vectors] == ["good"]
    assert len(result.problems) == 1 and "bad.pt" in result.problems[0]


# Bad numbers and metadata: the entry is skipped, the others import --------------------------

BIG = "9" * 400  # a JSON integer no float holds
DEEP = "[" * 40 + "]" * 40
BAD_NUMBERS = {  # case -> (format, the bad entry's text in its manifest, a piece of the problem)
    "passport scale of 400 digits": ("brainscope", f'"calibrated": {{"layer": 1, "scale": {BIG}}}',
                                     "calibrated.scale"),
    "passport scale 1e400": ("brainscope", '"calibrated": {"layer": 1, "scale": 1e400}',
                             "calibrated.scale"),
    "passport scale true": ("brainscope", '"calibrated": {"layer": 1, "scale": true}',
                            "calibrated.scale must be a number"),
    "passport layer of 400 digits": ("brainscope", f'"calibrated": {{"layer": {BIG}, "scale": 1}}',
                                     "is not a layer of the model (it has 4: 0..3)"),
    "score 1e400": ("brainscope", '"eval": {"score": 1e400}', "metadata holds a non-finite number"),
    "metadata too deep": ("brainscope", f'"eval": {DEEP}', "metadata nests deeper than 32"),
    "alpha of 400 digits": ("hidden-directions", f'"recommended_alpha": {BIG}', "recommended_alpha"),
    "alpha 1e400": ("hidden-directions", '"recommended_alpha": 1e400', "recommended_alpha"),
    "alpha past float32": ("hidden-directions", '"recommended_alpha": 1e39', "recommended_alpha"),
    "hidden-directions score -1e400": ("hidden-directions",
                                       '"recommended_alpha": 1, "score": -1e400', "non-finite"),
}
MARKERS = {"brainscope": '"marker": 424242', "hidden-directions": '"recommended_alpha": 424242.0'}


def _good_and_bad(root: Path, fmt: str, bad_text: str, hidden: int = HIDDEN) -> Path:
    """An export of ``good`` and ``bad`` in ``fmt``, ``bad``'s entry holding ``bad_text``."""
    if fmt == "brainscope":
        write_brainscope(root, {"good": rand(hidden, seed=1), "bad": rand(hidden, seed=2)},
                         {"good": {"calibrated": {"layer": 1, "scale": 2}}, "bad": {"marker": 424242}})
    else:
        write_hidden_directions(root, {"good": rand(LAYERS, HIDDEN, seed=1),
                                       "bad": rand(LAYERS, HIDDEN, seed=2)},
                                {"good": (1, 2.0), "bad": (1, 424242.0)})
    text = (root / "manifest.json").read_text()
    assert text.count(MARKERS[fmt]) == 1
    (root / "manifest.json").write_text(text.replace(MARKERS[fmt], bad_text))
    return root


@pytest.mark.parametrize("case", BAD_NUMBERS)
def test_a_bad_number_skips_its_entry_and_keeps_the_others(tmp_path, case):
    fmt, text, piece = BAD_NUMBERS[case]
    result = import_path(_good_and_bad(tmp_path / "export", fmt, text), n_layers=LAYERS)
    assert [v.id for v in result.vectors] == ["good"]
    assert result.vectors[0].preset.entries == ({"id": "good", "layer": 1, "scale": 2.0}
                                                | ({"decode_only": True} if fmt == "brainscope" else {}),)
    [problem] = result.problems
    assert piece in problem and "bad" in problem, problem


def test_a_gguf_field_json_cannot_carry_is_left_out_of_the_metadata(tmp_path):
    import gguf

    path = tmp_path / "cv.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_float64("controlvector.strength", float("inf"))
    writer.add_float32("controlvector.norm", 2.5)
    writer.add_tensor("direction.1", rand(HIDDEN, seed=0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    [vector] = only(import_path(path, n_layers=LAYERS)).values()
    assert "controlvector.strength" not in vector.metadata
    assert vector.metadata["controlvector.norm"] == 2.5


def test_startup_skips_an_entry_with_a_bad_number_and_loads_the_rest(tmp_path, caplog):
    root = _good_and_bad(tmp_path / "export", "brainscope", BAD_NUMBERS["passport scale of 400 digits"][1])
    with caplog.at_level(logging.INFO, logger="vllm.hotwire"):
        loaded = dict(load_dir(str(root), ModelShape(LAYERS, HIDDEN, "float32")))
    assert list(loaded) == ["good"]
    [skipped] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "skipping" in skipped and "bad.pt" in skipped and "calibrated.scale" in skipped


# Links in a directory ------------------------------------------------------------------------


def test_links_out_of_the_directory_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.safetensors").write_bytes(encode_safetensors(rand(HIDDEN, seed=1)))
    torch.save(torch.ones(HIDDEN), outside / "secret.pt")
    root = write_brainscope(tmp_path / "export", {"good": rand(HIDDEN, seed=2),
                                                  "listed": rand(HIDDEN, seed=3)})
    (root / "listed.pt").unlink()
    (root / "listed.pt").symlink_to(outside / "secret.pt")
    (root / "leak.safetensors").symlink_to(outside / "secret.safetensors")
    (root / "sub").mkdir()
    (root / "sub" / "x.safetensors").write_bytes(encode_safetensors(rand(HIDDEN, seed=4)))
    (root / "inner.safetensors").symlink_to(root / "sub" / "x.safetensors")  # stays inside: read
    result = import_path(root, n_layers=LAYERS)
    assert sorted(v.id for v in result.vectors) == ["good", "inner"]
    assert sorted(result.problems) == [
        f"{root / 'leak.safetensors'}: a link to {outside / 'secret.safetensors'}, outside {root}; not followed",
        f"{root / 'listed.pt'}: a link to {outside / 'secret.pt'}, outside {root}; not followed"]

    hd = write_hidden_directions(tmp_path / "dict", {"d": rand(LAYERS, HIDDEN, seed=5)}, {})
    (hd / "d.pt").unlink()
    (hd / "d.pt").symlink_to(outside / "secret.pt")
    assert "outside" in failure(hd)

    linked = tmp_path / "linked"
    linked.mkdir()
    (outside / "manifest.json").write_text('{"vectors": []}')
    (linked / "manifest.json").symlink_to(outside / "manifest.json")
    assert "manifest.json: a link to" in failure(linked)


# Layer numbering against a transformers forward --------------------------------------------


@pytest.fixture(scope="module")
def hf(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()


def _layer_outputs(model) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    outs: dict[int, torch.Tensor] = {}
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o.clone()))
               for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            hidden = model(torch.tensor(PROMPT), output_hidden_states=True).hidden_states
    finally:
        for h in handles:
            h.remove()
    return list(hidden), [outs[i] for i in range(len(outs))]


def test_hidden_state_k_is_the_output_of_decoder_layer_k_minus_1(hf):
    """The 1-based numbering of brainscope's extractors: ``hidden_states[k]`` (k >= 1) is what
    decoder layer ``k - 1`` outputs, hotwire's ``layer: k - 1``; the last one comes after the
    model's final norm."""
    hidden, outs = _layer_outputs(hf)
    assert len(hidden) == LAYERS + 1
    for k in range(1, LAYERS):
        assert torch.equal(hidden[k], outs[k - 1]), k
        assert not torch.equal(hidden[k], outs[k]), k
    with torch.no_grad():
        assert torch.equal(hidden[LAYERS], hf.model.norm(outs[LAYERS - 1]))


def _add_after(model, layer: int, value: torch.Tensor):
    """Source tools' steering: a forward hook adding ``value`` to ``model.model.layers[layer]``'s
    output (brainscope's ``_install_steer_hooks``, hidden-directions' ``sweep.py``, and where
    llama.cpp's ``build_cvec`` adds to block ``layer``)."""
    return model.model.layers[layer].register_forward_hook(lambda m, a, out: out + value)


def _add_before_next(model, layer: int, value: torch.Tensor):
    """hotwire's definition of ``layer: L``: the stream at the end of layer L, i.e. what layer
    L + 1 receives (the final norm after the last layer), plus ``value``."""
    nxt = model.model.layers[layer + 1] if layer + 1 < LAYERS else model.model.norm
    return nxt.register_forward_pre_hook(lambda m, args: (args[0] + value, *args[1:]))


def _logits(model, hooks) -> torch.Tensor:
    handles = [make() for make in hooks]
    try:
        with torch.no_grad():
            return model(torch.tensor(PROMPT)).logits[0].double()
    finally:
        for h in handles:
            h.remove()


def _hotwire_hooks(model, vectors, shift: int = 0) -> list:
    """Every imported preset's entries, applied as hotwire reads them (``shift``: one layer off,
    to show the comparison tells the layers apart)."""
    hooks = []
    for vector in vectors.values():
        for entry in parse_spec(list(vector.preset.entries)):
            for layer in entry.targets(frozenset(range(LAYERS))):
                row = vector.tensor[layer] if vector.tensor.ndim == 2 else vector.tensor
                value = entry.scale * torch.from_numpy(row)
                hooks.append(lambda layer=layer, value=value: _add_before_next(
                    model, layer + shift, value))
    return hooks


def _brainscope_case(tmp_path):
    v = rand(HIDDEN, seed=21) * 4
    root = write_brainscope(tmp_path / "bs", {"calm": v}, {"calm": {"calibrated": {
        "layer": 1, "scale": 2.0, "decode_only": False}}})
    return root, [(1, 2.0 * torch.from_numpy(v))]  # brainscope: hook on layers[1], strength 2


def _hidden_directions_case(tmp_path):
    t = rand(LAYERS, HIDDEN, seed=22) * 4
    root = write_hidden_directions(tmp_path / "hd", {"v_pref": t}, {"v_pref": (2, -1.5)})
    return root, [(2, -1.5 * torch.from_numpy(bf16(t)[2]))]  # sweep.py: hook on layers[2], alpha * v[2]


def _gguf_case(tmp_path):
    rows = {n: rand(HIDDEN, seed=30 + n) * 4 for n in (1, 2)}
    path = write_gguf(tmp_path / "cv.gguf", {f"direction.{n}": r for n, r in rows.items()})
    # llama.cpp: tensors[il] = direction.il, added to block il's output, for il = 1..n_layer-1
    return path, [(il, torch.from_numpy(rows[il])) for il in rows]


@pytest.mark.parametrize("case", [_brainscope_case, _hidden_directions_case, _gguf_case],
                         ids=["brainscope", "hidden-directions", "gguf"])
def test_imported_presets_steer_where_the_source_tool_does(hf, tmp_path, case):
    source, source_terms = case(tmp_path)
    vectors = only(import_path(source, n_layers=LAYERS))
    plain = _logits(hf, [])
    theirs = _logits(hf, [lambda l=l, v=v: _add_after(hf, l, v) for l, v in source_terms])
    ours = _logits(hf, _hotwire_hooks(hf, vectors))
    assert (theirs - plain).abs().max() > 1e-2  # the steering does something
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    off_by_one = _logits(hf, _hotwire_hooks(hf, vectors, shift=-1))
    assert (off_by_one - theirs).abs().max() > 1e-2


def _received(model) -> list[torch.Tensor]:
    """What each decoder layer receives, then what the final norm receives: entry ``k`` is the
    stream after layer ``k - 1``, ``hidden_states[k]`` in transformers' numbering."""
    seen: list[torch.Tensor] = []
    modules = [*model.model.layers, model.model.norm]
    handles = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
               for m in modules]
    try:
        with torch.no_grad():
            model(torch.tensor(PROMPT))
    finally:
        for h in handles:
            h.remove()
    return seen


def test_brainscope_spec_layer_l_moves_hidden_state_l_plus_one_first(hf, tmp_path):
    """brainscope steering at spec layer L leaves the stream up to ``hidden_states[L]`` as it
    was and moves ``hidden_states[L + 1]``, the output of decoder layer L, by exactly
    ``scale * v``: where the imported preset (``layer: L``) steers."""
    root, [(layer, value)] = _brainscope_case(tmp_path)
    [entry] = only(import_path(root))["calm"].preset.entries
    assert entry["layer"] == layer
    plain = _received(hf)
    handle = _add_after(hf, layer, value)
    try:
        steered = _received(hf)
    finally:
        handle.remove()
    for k in range(layer + 1):
        assert torch.equal(steered[k], plain[k]), k
    torch.testing.assert_close(steered[layer + 1] - plain[layer + 1],
                               value.expand_as(plain[layer + 1]), rtol=0, atol=1e-5)


# The engine's startup vectors ---------------------------------------------------------------


def test_startup_loads_a_brainscope_export_and_a_gguf_file(tmp_path, caplog):
    model = ModelShape(LAYERS, HIDDEN, "float32")
    calm = rand(HIDDEN, seed=40)
    root = write_brainscope(tmp_path / "export", {"calm": calm, "wide": rand(HIDDEN + 1, seed=41)},
                            {"calm": {"calibrated": {"layer": 2, "scale": 3}}})
    with caplog.at_level(logging.INFO, logger="vllm.hotwire"):
        loaded = dict(load_dir(str(root), model))
    assert list(loaded) == ["calm"]
    np.testing.assert_array_equal(loaded["calm"], calm[None, :])
    assert "wide.pt: shape [1, 129] does not match the model" in caplog.text
    assert '"layer": 2, "scale": 3.0, "decode_only": true' in caplog.text

    direction = rand(HIDDEN, seed=42)
    path = write_gguf(tmp_path / "happy.gguf", {"direction.3": direction})
    [(vector_id, rows)] = load_dir(str(path), model)
    assert vector_id == "happy" and rows.shape == (LAYERS, HIDDEN)
    np.testing.assert_array_equal(rows[3], direction)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="vllm.hotwire"):
        assert load_dir(str(tmp_path / "nowhere"), model) == []
    assert "no such file or directory" in caplog.text


def test_startup_files_whose_stem_ends_in_a_newline_are_skipped(tmp_path, caplog):
    blob = safetensors_blob({"v": ("F32", exact_vector(FP.hidden))})
    (tmp_path / "good.safetensors").write_bytes(blob)
    (tmp_path / ("c" * 64 + "\n.safetensors")).write_bytes(blob)
    with caplog.at_level(logging.ERROR, logger="vllm.hotwire"):
        loaded = load_dir(str(tmp_path), ModelShape(FP.n_layers, FP.hidden, FP.dtype))
    assert [vector_id for vector_id, _ in loaded] == ["good"]
    assert "not a valid vector id" in caplog.text


# ``hotwire vectors import`` against a real control API and mailbox ------------------------


@pytest.fixture
def rig(tmp_path):
    with Rig.running(tmp_path / "rig") as rig:
        yield rig


def cli(capsys, rig: Rig, *args: str) -> tuple[int, str, str]:
    status = main(["vectors", "import", *args, "--url", rig.server.url, "--token", TOKEN])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_import_uploads_vectors_and_stores_presets(rig, capsys, tmp_path):
    h = FP.hidden
    calm = exact_vector(h, seed=1)
    root = write_brainscope(tmp_path / "export", {"calm": calm},
                            {"calm": {"calibrated": {"layer": 1, "scale": 2}}})
    rows = {n: exact_vector(h, seed=n) for n in (1, 3)}
    gguf_path = write_gguf(tmp_path / "happy.gguf", {f"direction.{n}": r for n, r in rows.items()})

    status, out, err = cli(capsys, rig, str(root))
    assert status == EXIT_OK, err
    assert f"vector calm: {h}, generation 1, resident" in out
    assert "preset calm: calm on layer 1 at scale 2 (brainscope passport: calibrated at layer 1, scale 2" in out
    np.testing.assert_array_equal(rig.engine.entries("calm")[ANY_LAYER][2], calm)
    assert rig.catalog()["calm"]["metadata"]["calibrated"] == {"layer": 1, "scale": 2}

    status, out, err = cli(capsys, rig, str(gguf_path), "--id-prefix", "cv.")  # layers: the engine's
    assert status == EXIT_OK, err
    entries = rig.engine.entries("cv.happy")
    assert sorted(entries) == [1, 3]  # only the layers the file has directions for
    np.testing.assert_array_equal(entries[3][2], rows[3])
    presets = {p["name"]: p for p in rig.http.get("/steer/presets").json()["presets"]}
    assert presets["calm"]["entries"] == [{"id": "calm", "layer": 1, "scale": 2.0, "decode_only": True}]
    assert presets["cv.happy"]["entries"] == [{"id": "cv.happy", "layers": [1, 3], "scale": 1.0}]

    status, _, err = cli(capsys, rig, str(root))
    assert status == EXIT_CONFLICT and "exists" in err
    status, out, err = cli(capsys, rig, str(root), "--replace")
    assert status == EXIT_OK, err
    assert "generation 2" in out


def test_cli_import_takes_the_operators_layers_and_scale_for_its_presets(rig, capsys, tmp_path):
    """A GGUF file (repeng's) names no layer choice and its strength 1 is llama.cpp's:
    ``--layers`` and ``--scale`` make the preset, say what they chose, and the vector keeps
    every row the file has; a layer the file has no direction for is refused, by name."""
    h = FP.hidden
    rows = {n: exact_vector(h, seed=n) for n in (1, 2, 3)}
    gguf_path = write_gguf(tmp_path / "happy.gguf", {f"direction.{n}": r for n, r in rows.items()})
    status, out, err = cli(capsys, rig, str(gguf_path), "--layers", "2-3", "--scale", "-1.5")
    assert status == EXIT_OK, err
    assert "preset happy: happy on layers 2-3 at scale -1.5 (GGUF control vector happy.gguf: " \
           "layers 1-3, strength 1 as llama.cpp applies it; layers 2-3 and scale -1.5 chosen " \
           "at import)" in out
    assert sorted(rig.engine.entries("happy")) == [1, 2, 3]
    presets = {p["name"]: p for p in rig.http.get("/steer/presets").json()["presets"]}
    assert presets["happy"]["entries"] == [{"id": "happy", "layers": [2, 3], "scale": -1.5}]

    root = write_brainscope(tmp_path / "export", {"calm": exact_vector(h, seed=4)},
                            {"calm": {"calibrated": {"layer": 1, "scale": 2}}})
    status, out, err = cli(capsys, rig, str(root), "--scale", "3")  # the source's layer stays
    assert status == EXIT_OK, err
    presets = {p["name"]: p for p in rig.http.get("/steer/presets").json()["presets"]}
    assert presets["calm"]["entries"] == [{"id": "calm", "layer": 1, "scale": 3.0, "decode_only": True}]

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "bare.safetensors").write_bytes(encode_safetensors(exact_vector(h, seed=5)))
    status, out, err = cli(capsys, rig, str(plain), "--layers", "2")  # no preset in the source
    assert status == EXIT_OK, err
    assert "preset bare: bare on layer 2 at scale 1 (bare.safetensors: no preset in the source; " \
           "layers 2 chosen at import)" in out
    presets = {p["name"]: p for p in rig.http.get("/steer/presets").json()["presets"]}
    assert presets["bare"]["entries"] == [{"id": "bare", "layer": 2, "scale": 1.0}]

    status, _, err = cli(capsys, rig, str(gguf_path), "--id-prefix", "x.", "--layers", "0-2")
    assert status == EXIT_FILE and "--layers 0: the vector has no row there (it has 1-3)" in err
    status, _, err = cli(capsys, rig, str(gguf_path), "--id-prefix", "x.", "--layers", "4")
    assert status == EXIT_FILE and "--layers 4 is not a layer of the model" in err
    assert not any(name.startswith("x.") for name in rig.catalog())
    for bad in (["--layers", "1-x"], ["--scale", "nan"], ["--scale", "1e39"]):
        with pytest.raises(SystemExit) as exited:
            cli(capsys, rig, str(gguf_path), *bad)
        assert exited.value.code == EXIT_USAGE


def test_cli_import_skips_a_bad_file_imports_the_rest_and_says_so(rig, capsys, tmp_path):
    root = write_brainscope(tmp_path / "export", {"good": exact_vector(FP.hidden, seed=2),
                                                  "bad": exact_vector(FP.hidden, seed=3)},
                            {"good": {"calibrated": {"layer": 1, "scale": 1}}})
    torch.save({"not": "a tensor"}, root / "bad.pt")
    status, out, err = cli(capsys, rig, str(root))
    assert status == EXIT_FILE and "imported the rest; skipped 1 problem(s)" in err and "bad.pt" in err
    assert "vector good:" in out and "preset good:" in out
    assert list(rig.catalog()) == ["good"]
    assert [p["name"] for p in rig.http.get("/steer/presets").json()["presets"]] == ["good"]


def test_cli_import_with_bad_metadata_skips_that_file_without_a_traceback(rig, capsys, tmp_path):
    """A number the control API would refuse is caught before anything is sent: the import no
    longer stops half way."""
    root = _good_and_bad(tmp_path / "export", "brainscope", BAD_NUMBERS["score 1e400"][1], FP.hidden)
    status, out, err = cli(capsys, rig, str(root))
    assert status == EXIT_FILE and "metadata holds a non-finite number" in err, err
    assert "Traceback" not in err and list(rig.catalog()) == ["good"]


def test_cli_import_that_reads_nothing_imports_nothing(rig, capsys, tmp_path):
    root = write_brainscope(tmp_path / "export", {"bad": exact_vector(FP.hidden, seed=3)})
    torch.save({"not": "a tensor"}, root / "bad.pt")
    status, _, err = cli(capsys, rig, str(root))
    assert status == EXIT_FILE and "nothing imported, 1 problem(s)" in err and "bad.pt" in err
    assert rig.catalog() == {}
    status, _, err = cli(capsys, rig, str(tmp_path / "missing"))
    assert status == EXIT_FILE and "no such file or directory" in err
    gguf_path = write_gguf(tmp_path / "big.gguf", {"direction.2": exact_vector(FP.hidden, seed=4)})
    status, _, err = cli(capsys, rig, str(gguf_path), "--model-layers", "2")
    assert status == EXIT_FILE and "names layer 2, but the model has 2" in err
    assert rig.catalog() == {} and rig.http.get("/steer/presets").json()["presets"] == []


def test_cli_import_without_an_engine_asks_for_the_layer_count(tmp_path, capsys):
    rig = Rig(tmp_path / "rig")
    rig.start_api()  # no engine attached: GET /steer/slots is 503
    try:
        path = write_gguf(tmp_path / "cv.gguf", {"direction.1": exact_vector(FP.hidden, seed=5)})
        status, _, err = cli(capsys, rig, str(path))
        assert status == EXIT_FILE and "needs the model's layer count" in err
        status, _, err = cli(capsys, rig, str(path), "--model-layers", str(FP.n_layers))
        assert status == EXIT_ERROR and "no_engine" in err  # read fine; the upload needs an engine
    finally:
        rig.stop()
