"""SAE features as vectors (:mod:`hotwire.shared.importers`): SAELens folders, Gemma Scope
``params.npz`` files and Neuronpedia records.

Each format is written here as its tool writes it (SAELens: ``cfg.json`` with the hook point
under ``metadata`` as sae-lens 6 saves it, or at the top level as older versions did, and
``sae_weights.safetensors``; Gemma Scope: ``np.savez`` in its repository's folder layout;
Neuronpedia: the API's ``{"vector": ...}`` answer and the exports' gzipped JSON lines). The
layer an import names is checked against a transformers forward of the tiny random Qwen3: a
decoder row that is the stream read at a hook point imports as a vector of the layer whose output
is that stream, and Neuronpedia's own steering (``strength * vector`` added at its hook) gives
the logits of hotwire's reading of the imported preset.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from hotwire.control_api.cli.exit_codes import EXIT_OK, EXIT_USAGE
from hotwire.control_api.cli.main import main
from hotwire.shared.importers import VectorImportError, import_path
from hotwire.shared.mailbox import ANY_LAYER
from hotwire.shared.spec import parse_spec

from conftest import HIDDEN, LAYERS
from control_harness import FP, TOKEN, Rig, exact_vector
from test_importers import (_add_before_next, _layer_outputs, _logits, _received,  # noqa: F401
                            hf, rand)  # hf: the fixture

D_SAE = 12


# Writers -----------------------------------------------------------------------------------


def write_sae_lens(root: Path, w_dec: np.ndarray, hook: str, *, dtype: torch.dtype = torch.float32,
                   threshold: np.ndarray | None = None, before_6: bool = False) -> Path:
    """A SAELens folder: weights and config as ``SAE.save_model`` writes them (sae-lens 6), or a
    config as sae-lens before 6.0 wrote it (``hook_point`` at the top level)."""
    root.mkdir(parents=True)
    d_sae, d_in = w_dec.shape
    tensors = {"W_dec": torch.from_numpy(w_dec), "W_enc": torch.from_numpy(w_dec.T.copy()),
               "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)}
    if threshold is not None:
        tensors["threshold"] = torch.from_numpy(threshold)
    save_file({k: v.to(dtype) for k, v in tensors.items()}, root / "sae_weights.safetensors")
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    if before_6:
        cfg = {"d_in": d_in, "d_sae": d_sae, "hook_point": hook, "hook_point_layer": 0,
               "hook_point_head_index": None, "model_name": "tiny-qwen3", "dtype": name,
               "sae_lens_training_version": "2.1.0", "normalize_activations": False}
    else:
        cfg = {"d_in": d_in, "d_sae": d_sae, "dtype": name, "device": "cpu",
               "apply_b_dec_to_input": True, "normalize_activations": "none",
               "reshape_activations": "none",
               "architecture": "jumprelu" if threshold is not None else "standard",
               "metadata": {"hook_name": hook, "model_name": "tiny-qwen3",
                            "sae_lens_version": "6.54.12", "neuronpedia_id": None}}
    (root / "cfg.json").write_text(json.dumps(cfg))
    return root


def write_gemma_scope(repo: Path, layer_folder: str, w_dec: np.ndarray, threshold: np.ndarray,
                      compressed: bool = False) -> Path:
    """``<repo>/<layer_folder>/width_16k/average_l0_71/params.npz``, as the tutorial reads it."""
    folder = repo / layer_folder / "width_16k" / "average_l0_71"
    folder.mkdir(parents=True)
    save = np.savez_compressed if compressed else np.savez
    save(folder / "params.npz", W_enc=w_dec.T.copy(), W_dec=w_dec, b_enc=np.zeros(len(w_dec)),
         b_dec=np.zeros(w_dec.shape[1]), threshold=threshold)
    return folder / "params.npz"


def neuronpedia_record(values: np.ndarray, block: int, *, index: str = "1",
                       strength: float | None = 44, label: str = "dinosaurs") -> dict:
    """A custom vector as the webapp stores it (``/api/vector/new``: ``blocks.<L>.hook_resid_pre``,
    source ``<L>-neuronpedia-resid-pre``)."""
    return {"modelId": "tiny-qwen3", "layer": f"{block}-neuronpedia-resid-pre", "index": index,
            "hasVector": True, "vector": [float(v) for v in values], "vectorLabel": label,
            "hookName": f"blocks.{block}.hook_resid_pre", "vectorDefaultSteerStrength": strength}


def sae_feature_record(index: int) -> dict:
    """An SAE feature as the exports hold it: no vector of its own."""
    return {"modelId": "tiny-qwen3", "layer": "2-res-16k", "index": str(index), "hasVector": False,
            "vector": [], "vectorLabel": None, "hookName": None,
            "explanations": [{"description": "mentions of the sea"}]}


def only(result) -> dict:
    assert result.problems == []
    return {v.id: v for v in result.vectors}


def failure(path: Path, **kwargs) -> str:
    try:
        result = import_path(path, n_layers=LAYERS, **kwargs)
    except VectorImportError as e:
        return str(e)
    assert result.problems, "no problem reported"
    return "\n".join(result.problems)


# Formats -----------------------------------------------------------------------------------


def test_sae_lens_features_become_vectors_named_after_the_sae(tmp_path):
    w_dec, threshold = rand(D_SAE, HIDDEN, seed=1), np.linspace(0.1, 1.2, D_SAE, dtype=np.float32)
    root = write_sae_lens(tmp_path / "blocks.2.hook_resid_post", w_dec, "blocks.2.hook_resid_post",
                          threshold=threshold)
    vectors = only(import_path(root, n_layers=LAYERS, features=[7, 0]))
    assert list(vectors) == ["blocks.2.hook_resid_post.7", "blocks.2.hook_resid_post.0"]
    v = vectors["blocks.2.hook_resid_post.7"]
    np.testing.assert_array_equal(v.tensor, w_dec[7])
    assert v.layers is None and v.preset is None  # one slot for any layer; no scale in the source
    assert v.metadata == {
        "imported_from": "sae-lens", "model_name": "tiny-qwen3",
        "hook_name": "blocks.2.hook_resid_post", "architecture": "jumprelu", "d_in": HIDDEN,
        "d_sae": D_SAE, "dtype": "float32", "normalize_activations": "none",
        "apply_b_dec_to_input": True, "sae_lens_version": "6.54.12", "sae": "blocks.2.hook_resid_post",
        "feature": 7, "layer": 2, "decoder_norm": round(float(np.linalg.norm(w_dec[7])), 6),
        "threshold": float(threshold[7])}
    named = only(import_path(root, n_layers=LAYERS, features=[3], sae_name="res2", id_prefix="q."))
    assert list(named) == ["q.res2.3"]


def test_sae_lens_reads_bfloat16_weights_and_configs_from_before_6(tmp_path):
    w_dec = rand(D_SAE, HIDDEN, seed=2)
    root = write_sae_lens(tmp_path / "old", w_dec, "blocks.3.hook_resid_pre", dtype=torch.bfloat16,
                          before_6=True)
    [v] = only(import_path(root, n_layers=LAYERS, features=[5])).values()
    expected = torch.from_numpy(w_dec[5]).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(v.tensor, expected)
    assert (v.metadata["layer"], v.metadata["hook_name"]) == (2, "blocks.3.hook_resid_pre")


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_gemma_scope_params_take_the_layer_from_the_repository_layout(tmp_path, compressed):
    w_dec, threshold = rand(D_SAE, HIDDEN, seed=3), np.arange(D_SAE, dtype=np.float32) / 10
    hub = tmp_path / "models--google--gemma-scope-2b-pt-res" / "snapshots" / "abc123"
    path = write_gemma_scope(hub, "layer_1", w_dec, threshold, compressed)
    vectors = only(import_path(path, n_layers=LAYERS, features=[11, 4]))
    assert list(vectors) == ["layer_1-width_16k-average_l0_71.11", "layer_1-width_16k-average_l0_71.4"]
    v = vectors["layer_1-width_16k-average_l0_71.4"]
    np.testing.assert_array_equal(v.tensor, w_dec[4])
    assert {k: v.metadata[k] for k in ("layer", "hook_name", "release", "model", "threshold")} == {
        "layer": 1, "hook_name": "blocks.1.hook_resid_post", "release": "gemma-scope-2b-pt-res",
        "model": "gemma-2-2b", "threshold": pytest.approx(0.4)}
    assert list(only(import_path(path.parent, n_layers=LAYERS, features=[4]))) == [
        "layer_1-width_16k-average_l0_71.4"]  # its folder reads the same


def test_neuronpedia_records_bring_their_label_and_default_strength(tmp_path):
    values = rand(HIDDEN, seed=4)
    answer = tmp_path / "dinosaurs.json"
    answer.write_text(json.dumps({"vector": neuronpedia_record(values, 2)}))  # /api/vector/get
    [v] = only(import_path(answer, n_layers=LAYERS)).values()
    assert v.id == "2-neuronpedia-resid-pre.1"
    np.testing.assert_array_equal(v.tensor, values)
    assert v.preset.entries == ({"id": v.id, "layer": 1, "scale": 44.0},)
    assert "dinosaurs" in v.preset.description and "blocks.2.hook_resid_pre" in v.preset.description
    assert {k: v.metadata[k] for k in ("label", "layer", "default_steer_strength", "url")} == {
        "label": "dinosaurs", "layer": 1, "default_steer_strength": 44,
        "url": "https://www.neuronpedia.org/tiny-qwen3/2-neuronpedia-resid-pre/1"}

    export = tmp_path / "batch-0.jsonl.gz"
    lines = [sae_feature_record(0), neuronpedia_record(values, 3, index="7", strength=None),
             sae_feature_record(1)]
    with gzip.open(export, "wt") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines))
    result = import_path(export, n_layers=LAYERS)
    [v] = result.vectors
    assert (v.id, v.metadata["layer"], v.preset) == ("3-neuronpedia-resid-pre.7", 2, None)
    assert result.problems == [f"{export}: 2 record(s) have no vector values (SAE features keep "
                               "their direction in their SAE's weights: import the SAE's own "
                               "files with --features)"]
    assert import_path(export, n_layers=LAYERS, features=[7]).problems == []


# Layers against a transformers forward -----------------------------------------------------


@pytest.mark.parametrize("block, side", [(2, "post"), (2, "pre"), (1, "pre"), (3, "post")])
def test_the_imported_layer_outputs_the_stream_the_hook_point_reads(hf, tmp_path, block, side):
    """A decoder row that is the stream at ``blocks.<block>.hook_resid_<side>`` (what block
    ``block`` receives, or outputs), at the prompt's last token, imports as a vector whose
    layer outputs exactly that stream there, and no other layer does."""
    received = [r[0, -1].numpy() for r in _received(hf)]  # what layer k receives
    output = [o[0, -1].numpy() for o in _layer_outputs(hf)[1]]  # what layer k outputs
    stream = (received if side == "pre" else output)[block]
    w_dec = rand(D_SAE, HIDDEN, seed=5)
    w_dec[6] = stream
    root = write_sae_lens(tmp_path / "sae", w_dec, f"blocks.{block}.hook_resid_{side}")
    [v] = only(import_path(root, n_layers=LAYERS, features=[6])).values()
    layer = v.metadata["layer"]
    np.testing.assert_array_equal(output[layer], v.tensor)
    assert all(not np.array_equal(output[other], v.tensor) for other in range(LAYERS) if other != layer)


def _add_to_input(model, block: int, value: torch.Tensor):
    """Neuronpedia's steering: ``strength * vector`` added at ``blocks.<block>.hook_resid_pre``,
    the stream block ``block`` receives, on every position."""
    return model.model.layers[block].register_forward_pre_hook(
        lambda m, args: (args[0] + value, *args[1:]))


def _hotwire(model, vector, shift: int = 0) -> list:
    """The imported preset as hotwire applies it (``shift``: one layer off)."""
    [entry] = parse_spec(list(vector.preset.entries))
    value = entry.scale * torch.from_numpy(vector.tensor)
    return [lambda: _add_before_next(model, entry.layer + shift, value)]


def test_a_neuronpedia_preset_steers_where_neuronpedia_does(hf, tmp_path):
    values = rand(HIDDEN, seed=6)
    path = tmp_path / "v.json"
    path.write_text(json.dumps(neuronpedia_record(values, 2, strength=3.0)))
    [v] = only(import_path(path, n_layers=LAYERS)).values()
    plain = _logits(hf, [])
    theirs = _logits(hf, [lambda: _add_to_input(hf, 2, 3.0 * torch.from_numpy(values))])
    ours = _logits(hf, _hotwire(hf, v))
    assert (theirs - plain).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert (_logits(hf, _hotwire(hf, v, shift=1)) - theirs).abs().max() > 1e-2


# Bad inputs --------------------------------------------------------------------------------


def _sae(tmp_path: Path, hook: str = "blocks.1.hook_resid_post", **cfg_changes) -> Path:
    root = write_sae_lens(tmp_path / "sae", rand(D_SAE, HIDDEN, seed=7), hook)
    if cfg_changes:
        cfg = json.loads((root / "cfg.json").read_text())
        cfg.update(cfg_changes)
        (root / "cfg.json").write_text(json.dumps(cfg))
    return root


BAD = {  # name -> (make(tmp_path) -> path, import arguments, a piece of the message)
    "no features": (lambda t: _sae(t), {}, "pick the ones to import by index (--features"),
    "feature past the end": (lambda t: _sae(t), {"features": [3, 12, 40]},
                             f"has {D_SAE} features (0..{D_SAE - 1}); no feature 12, 40"),
    "MLP hook": (lambda t: _sae(t, "blocks.1.hook_mlp_out"), {"features": [1]},
                 "'blocks.1.hook_mlp_out' is not the residual stream between blocks"),
    "the embedding": (lambda t: _sae(t, "blocks.0.hook_resid_pre"), {"features": [1]},
                      "blocks.0.hook_resid_pre is the embedding"),
    "a layer the model lacks": (lambda t: _sae(t, f"blocks.{LAYERS}.hook_resid_post"),
                                {"features": [1]}, f"is not a layer of the model (it has {LAYERS}"),
    "a head": (lambda t: _sae(t, hook_head_index=3), {"features": [1]}, "one attention head"),
    "sizes that disagree": (lambda t: _sae(t, d_in=HIDDEN + 1), {"features": [1]},
                            f"W_dec has shape [{D_SAE}, {HIDDEN}], but cfg.json says"),
    "truncated weights": (lambda t: _truncated(_sae(t)), {"features": [1]},
                          "sae_weights.safetensors"),
    "features of plain vectors": (lambda t: _plain_dir(t), {"features": [1]},
                                  "--features picks an SAE's features"),
    "gemma scope mlp": (lambda t: write_gemma_scope(
        t / "gemma-scope-2b-pt-mlp", "layer_1", rand(D_SAE, HIDDEN, seed=8), np.zeros(D_SAE)),
        {"features": [1]}, "gemma-scope-2b-pt-mlp SAEs read the MLP output"),
    "gemma scope outside its layout": (lambda t: write_gemma_scope(
        t / "downloads", "layer_1", rand(D_SAE, HIDDEN, seed=8), np.zeros(D_SAE)),
        {"features": [1]}, "cannot tell which stream this SAE reads"),
    "gemma scope embedding": (lambda t: write_gemma_scope(
        t / "gemma-scope-2b-pt-res", "embedding", rand(D_SAE, HIDDEN, seed=8), np.zeros(D_SAE)),
        {"features": [1]}, "no layer_<L> folder"),
    "neuronpedia not json": (lambda t: _written(t / "v.jsonl", b'{"vector": [1]}\n{not json\n'),
                             {}, "v.jsonl:2: not JSON"),
    "neuronpedia values not numbers": (lambda t: _written(t / "v.json", json.dumps(
        {**neuronpedia_record(np.ones(HIDDEN), 2), "vector": ["a"] * HIDDEN}).encode()), {},
        "`vector` must be a list of numbers"),
    "neuronpedia an MLP hook": (lambda t: _written(t / "v.json", json.dumps(
        {**neuronpedia_record(np.ones(HIDDEN), 2), "hookName": "blocks.2.hook_mlp_out"}).encode()),
        {}, "is not the residual stream between blocks"),
}


def _truncated(root: Path) -> Path:
    weights = root / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-HIDDEN * 4 * 6])
    return root


def _plain_dir(tmp_path: Path) -> Path:
    from hotwire.shared.wire import encode_safetensors

    (tmp_path / "v.safetensors").write_bytes(encode_safetensors(np.ones(HIDDEN, np.float32)))
    return tmp_path


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", BAD)
def test_bad_saes_are_named_with_the_reason(tmp_path, case):
    make, kwargs, piece = BAD[case]
    message = failure(make(tmp_path), **kwargs)
    assert piece in message, message


# ``hotwire vectors import`` ----------------------------------------------------------------


@pytest.fixture
def rig(tmp_path):
    with Rig.running(tmp_path / "rig") as rig:
        yield rig


def test_cli_imports_the_features_it_is_given(rig, capsys, tmp_path):
    w_dec = np.stack([exact_vector(FP.hidden, seed=s) for s in range(D_SAE)])
    root = write_sae_lens(tmp_path / "res-jb", w_dec, "blocks.1.hook_resid_pre")
    status = main(["vectors", "import", str(root), "--features", "2,5-6", "--sae-name", "jb",
                   "--url", rig.server.url, "--token", TOKEN])
    out, err = capsys.readouterr()
    assert status == EXIT_OK, err
    assert [line.split(":")[0] for line in out.splitlines()] == ["vector jb.2", "vector jb.5",
                                                                 "vector jb.6"]
    np.testing.assert_array_equal(rig.engine.entries("jb.5")[ANY_LAYER][2], w_dec[5])
    meta = rig.catalog()["jb.5"]["metadata"]
    assert (meta["feature"], meta["layer"], meta["hook_name"]) == (5, 0, "blocks.1.hook_resid_pre")
    for bad in ("x", "3-", "5-2", "", "0-99999999"):
        with pytest.raises(SystemExit) as exited:
            main(["vectors", "import", str(root), "--features", bad, "--url", rig.server.url])
        assert exited.value.code == EXIT_USAGE
    capsys.readouterr()
