"""The steering op and its tables against a direct computation: on CPU tensors, and (``-m gpu``)
the Triton kernel against the torch reference."""

from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

from hotwire.engine_plugin import idle_graphs, steer_op
from hotwire.engine_plugin.interventions import ADD
from hotwire.engine_plugin.steering import SteeringTables, anchors, arm, decoder_layers, steer
from hotwire.shared.spec import NO_END

H = 16
CPU = torch.device("cpu")


def each_token(route: torch.Tensor) -> torch.Tensor:
    """``tok_row`` for a per-token table: token t reads row t (most tests write a token's entries
    directly; the engine's rows are per request, shared by its tokens)."""
    return torch.arange(route.shape[0], dtype=torch.int32, device=route.device)


def reference(x, residual, pos, bank, route, tok_row=None, scratch=None):
    """The op's reference run on a copy of ``x``: the steered stream (``x`` is left as it was);
    ``route`` per token unless ``tok_row`` names each token's row."""
    out = x.clone()
    tok_row = each_token(route) if tok_row is None else tok_row
    assert steer_op.reference(out, residual, pos, bank, route, tok_row, scratch) is None
    return out


def bound(bank, route, tok_row=None, step=None, pos=0):
    """``(anchor, layer)``: a fresh anchor bound to these tables (keep ``layer``: the binding lives
    as long as it does)."""
    layer = steer_op.ArmedLayer(bank, route, each_token(route) if tok_row is None else tok_row, step, pos)
    anchor = torch.empty(1, device=bank.device)
    steer_op.bind(anchor, layer)
    return anchor, layer


def opcheck(x, residual, pos, bank, route, tok_row):
    """``torch.library.opcheck`` of the op given these tables. opcheck runs the op on copies of its
    inputs, and a copy of an anchor has an address no layer is bound to: here every address is."""
    layer = steer_op.ArmedLayer(bank, route, tok_row)
    every = type("Every", (), {"get": lambda self, ptr: layer})()
    with mock.patch.object(steer_op, "_LAYERS", every):
        torch.library.opcheck(torch.ops.hotwire.steer_.default, (x, residual, pos, torch.empty(1, device=x.device)))


def op(x, residual, pos, bank, route, tok_row=None):
    """The registered op (``hotwire::steer_``, in place) on a copy of ``x``, given these tables."""
    out = x.clone()
    anchor, layer = bound(bank, route, tok_row)
    torch.ops.hotwire.steer_(out, residual, pos, anchor)
    return out


def steered(t, pos, x, residual, positions):
    """Armed layer ``pos`` of tables ``t`` steering a copy of ``x`` (:func:`.steering.steer`: bound
    as :func:`.steering.arm` binds it, with the tables' step state)."""
    layers = {i: nn.Linear(H, H) for i in range(len(t.layers))}
    arm(layers, anchors(layers, list(layers), CPU), t)
    return steer(layers[pos], x.clone(), residual, positions)


def _bits(v: float) -> int:
    return torch.tensor(v, dtype=torch.float32).view(torch.int32).item()


def _entry(row: int, lo: int, hi: int, scale: float, mode: int = ADD, clo: float = 0.0,
           chi: float = 0.0) -> torch.Tensor:
    """One routing entry: (bank row, lo, hi, mode, a, clamp lo, clamp hi, 0), floats as bits."""
    return torch.tensor([row, lo, hi, mode, _bits(scale), _bits(clo), _bits(chi), 0], dtype=torch.int32)


def _tables(requests=4, entries=2, armed=2, dtype=torch.float32):
    t = SteeringTables(slots=8, hidden=H, armed=armed, requests=requests, entries=entries,
                       max_tokens=32, dtype=dtype, device=torch.device("cpu"))
    torch.manual_seed(0)
    t.bank[1:] = torch.randn(8, H)
    return t


def test_unsteered_tokens_are_returned_bit_for_bit():
    t = _tables()
    x = torch.randn(5, H)
    x[0, :3] = torch.tensor([-0.0, 0.0, 1e-38])  # signed zeros and denormals survive too
    out = steered(t, 0, x, torch.randn(5, H), torch.arange(5))
    assert torch.equal(out, x) and torch.equal(torch.signbit(out), torch.signbit(x))


def test_entries_add_scaled_rows_on_their_positions_only():
    t = _tables()
    # request row 1: layer-position 0 has two entries: bank row 3 on all positions, bank row 5 on [2, 4)
    t.route[1, 0, 0] = _entry(3, 0, NO_END, 1.5)
    t.route[1, 0, 1] = _entry(5, 2, 4, -2.0)
    t.tok_row[:6] = torch.tensor([0, 1, 1, 1, 1, 0], dtype=torch.int32)  # tokens 1-4 belong to request row 1
    x, pos = torch.randn(6, H), torch.tensor([9, 0, 1, 2, 3, 4])
    out = steered(t, 0, x, None, pos)
    want = x.clone()
    for tok in range(1, 5):
        want[tok] += 1.5 * t.bank[3]
        if 2 <= pos[tok] < 4:
            want[tok] += -2.0 * t.bank[5]
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert torch.equal(out[0], x[0]) and torch.equal(out[5], x[5])
    assert torch.equal(steered(t, 1, x, None, pos), x)  # the other armed layer has no entries


def _mode_entry(spec: dict, row: int, bank: torch.Tensor) -> torch.Tensor:
    """The route entry admission writes for ``spec`` on bank row ``row``."""
    from hotwire.engine_plugin.interventions import coefficient_words
    from hotwire.shared.spec import parse_spec

    (e,) = parse_spec({"id": "v", "layer": 0, **spec})
    mode, a, lo, hi = coefficient_words(e, float(bank[row].double().norm()))
    return torch.tensor([row, 0, NO_END, mode, a, lo, hi, 0], dtype=torch.int32)


def _stream_case(seed=1):
    g = torch.Generator().manual_seed(seed)
    x, res = torch.randn(4, H, generator=g), 3 * torch.randn(4, H, generator=g)
    bank = torch.zeros(3, H)
    bank[1], bank[2] = 2 * torch.randn(H, generator=g), torch.randn(H, generator=g)
    return x, res, bank


@pytest.mark.parametrize("spec,want", [
    ({"mode": "add", "scale": 0.5}, lambda h, v, u: h + 0.5 * v),
    ({"mode": "norm", "scale": 0.25}, lambda h, v, u: h + 0.25 * h.norm(dim=-1, keepdim=True) * u),
    ({"mode": "ablate"}, lambda h, v, u: h - (h @ u)[:, None] * u),
    ({"mode": "ablate", "scale": 0.5}, lambda h, v, u: h - 0.5 * (h @ u)[:, None] * u),
    ({"mode": "clamp", "lo": -0.5, "hi": 0.5}, lambda h, v, u: h + ((h @ u).clamp(-0.5, 0.5) - h @ u)[:, None] * u),
    ({"mode": "clamp", "lo": 2.0, "hi": 2.0}, lambda h, v, u: h + (2.0 - h @ u)[:, None] * u),
    ({"mode": "clamp", "hi": 0.0}, lambda h, v, u: h + ((h @ u).clamp(max=0.0) - h @ u)[:, None] * u),
])
def test_each_mode_moves_the_stream_by_its_formula(spec, want):
    """The stream the next layer sees (output + residual) is the mode's formula of the stream."""
    x, res, bank = _stream_case()
    route = _mode_entry(spec, 1, bank).expand(4, 1, 8).contiguous()
    out = reference(x, res, torch.arange(4), bank, route)
    h, v = (x + res).double(), bank[1].double()
    torch.testing.assert_close((out + res).double(), want(h, v, v / v.norm()), rtol=1e-5, atol=1e-5)


def test_an_ablated_direction_is_gone_and_a_pinned_one_sits_at_its_value():
    x, res, bank = _stream_case(seed=2)
    u = bank[1].double() / bank[1].double().norm()
    out = reference(x, res, torch.arange(4), bank, _mode_entry({"mode": "ablate"}, 1, bank).expand(4, 1, 8))
    assert ((out + res).double() @ u).abs().max() < 1e-5 < ((x + res).double() @ u).abs().min()
    out = reference(x, res, torch.arange(4), bank,
                    _mode_entry({"mode": "clamp", "lo": 3.0, "hi": 3.0}, 1, bank).expand(4, 1, 8))
    torch.testing.assert_close((out + res).double() @ u, torch.full((4,), 3.0, dtype=torch.float64))


def test_entries_on_one_layer_read_the_same_stream_so_their_order_does_not_matter():
    x, res, bank = _stream_case(seed=3)
    a = _mode_entry({"mode": "ablate"}, 1, bank)
    b = _mode_entry({"mode": "norm", "scale": 0.5}, 2, bank)
    ab = reference(x, res, torch.arange(4), bank, torch.stack([a, b]).expand(4, 2, 8))
    ba = reference(x, res, torch.arange(4), bank, torch.stack([b, a]).expand(4, 2, 8))
    torch.testing.assert_close(ab, ba, rtol=1e-6, atol=1e-6)
    h = (x + res).double()
    u1, u2 = (bank[i].double() / bank[i].double().norm() for i in (1, 2))
    want = h - (h @ u1)[:, None] * u1 + 0.5 * h.norm(dim=-1, keepdim=True) * u2  # both from h
    torch.testing.assert_close((ab + res).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [{"mode": "add", "scale": 1.5}, {"mode": "ablate"}, {"mode": "norm", "scale": 0.5}])
def test_entry_columns_no_token_has_on_change_no_bit(spec):
    """A request uses one or two of a layer's entry columns; the empty ones (and an entry whose
    window holds no token of the step) add -0.0, so leaving them out of the sums, as the CPU kernel
    does, must give the same bits as the entries alone."""
    x, res, bank = _stream_case(seed=5)
    a = _mode_entry(spec, 1, bank)
    b = _mode_entry({"mode": "add", "scale": -2.0}, 2, bank)
    late = _entry(2, 1000, NO_END, 4.0)  # its window starts after every token of the step
    empty = torch.zeros(8, dtype=torch.int32)
    alone = reference(x, res, torch.arange(4), bank, torch.stack([a, b]).expand(4, 2, 8))
    padded = reference(x, res, torch.arange(4), bank, torch.stack([empty, a, late, b, empty]).expand(4, 5, 8))
    assert torch.equal(alone.view(torch.int32), padded.view(torch.int32))


def test_a_projecting_entry_reads_the_residual_and_a_layer_without_one_uses_its_output():
    x, res, bank = _stream_case(seed=4)
    e = _mode_entry({"mode": "ablate"}, 1, bank).expand(4, 1, 8)
    u = bank[1].double() / bank[1].double().norm()
    assert (reference(x, None, torch.arange(4), bank, e).double() @ u).abs().max() < 1e-5
    assert not torch.equal(reference(x, res, torch.arange(4), bank, e), reference(x, None, torch.arange(4), bank, e))


@pytest.mark.parametrize("spec,reason", [({"mode": "ablate"}, "zero_vector"), ({"mode": "norm"}, "zero_vector"),
                                         ({"mode": "clamp", "lo": 0.0}, "zero_vector")])
def test_a_projection_on_a_zero_vector_is_refused(spec, reason):
    from hotwire.shared.spec import SpecError

    with pytest.raises(SpecError) as err:
        _mode_entry(spec, 0, torch.zeros(1, H))
    assert err.value.reason == reason
    assert _mode_entry({"scale": 2.0}, 0, torch.zeros(1, H))[3] == ADD  # an add of zero is harmless


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projections_stay_finite_on_extreme_streams(dtype):
    """Invariant 8 for the projecting modes: an overflowing ``h·v`` or ``‖h‖`` saturates."""
    top = torch.finfo(dtype).max
    bank = torch.zeros(2, H, dtype=dtype)
    bank[1] = 1.0
    x = torch.full((3, H), top, dtype=dtype)
    x[1, ::2] = -top
    route = torch.stack([_mode_entry({"mode": m, **kw}, 1, bank.float()) for m, kw in
                         (("norm", {"scale": 64.0}), ("ablate", {"scale": -64.0}), ("clamp", {"lo": 1e30}))])
    out = reference(x, x, torch.zeros(3, dtype=torch.long), bank, route.expand(3, 3, 8))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_steered_token_saturates_and_an_unsteered_one_keeps_even_infinities(dtype):
    """Invariant 8's backstop: a sum past the dtype's range is clamped to its largest finite
    value, never rounded to inf; an unsteered token's own inf is left as it is (invariant 1)."""
    top = torch.finfo(dtype).max
    bank = torch.zeros(3, H, dtype=dtype)
    bank[1], bank[2] = top, -top
    route = torch.zeros(3, 2, 8, dtype=torch.int32)
    route[0, 0], route[0, 1] = _entry(1, 0, NO_END, 1.0), _entry(1, 0, NO_END, 1.0)  # top + top + top
    route[1, 0], route[1, 1] = _entry(2, 0, NO_END, 4.0), _entry(1, 0, NO_END, 4.0)  # -4 top + 4 top
    x = torch.full((3, H), top, dtype=dtype)
    x[1] = 1.0
    x[2] = float("inf")  # token 2 is unsteered
    out = reference(x, None, torch.zeros(3, dtype=torch.long), bank, route)
    assert torch.isfinite(out[:2]).all()
    assert torch.equal(out[0], torch.full((H,), top, dtype=dtype))
    assert out[1].abs().max() <= 1.0  # inf - inf would be NaN: each term saturates, and they cancel
    assert torch.equal(out[2], x[2])


def test_steered_request_keeps_its_bits_outside_its_window():
    t = _tables(dtype=torch.bfloat16)
    t.route[1, 0, 0] = _entry(3, 100, 200, 2.0)  # a window no token is in
    t.tok_row[:4] = 1
    x = torch.randn(4, H).to(torch.bfloat16)
    x[0, :2] = torch.tensor([-0.0, 0.0])
    out = steered(t, 0, x, x, torch.arange(4))
    assert torch.equal(out.view(torch.int16), x.view(torch.int16))  # every bit, signed zeros included


def test_mrope_positions_use_the_first_row():
    t = _tables()
    t.route[1, 0, 0] = _entry(2, 3, 4, 1.0)
    t.tok_row[:2] = 1
    x = torch.zeros(2, H)
    out = steered(t, 0, x, None, torch.tensor([[3, 4], [0, 0], [0, 0]]))
    assert torch.equal(out[0], t.bank[2]) and torch.equal(out[1], x[1])


class QwenishDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else residual + hidden_states
        return self.lin(residual), residual


class Model(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList(QwenishDecoderLayer() for _ in range(n))


def test_arm_wraps_only_chosen_layers_and_keeps_names():
    model = Model()
    names = [n for n, _ in model.named_parameters()]
    found = decoder_layers(model)
    assert sorted(found) == [0, 1, 2]
    t = _tables(armed=1)
    armed = arm(found, anchors(found, [2], CPU), t)
    assert armed.layers == (2,) and armed.position(2) == 0 and armed.position(0) is None
    assert [n for n, _ in model.named_parameters()] == names
    assert isinstance(model.layers[2], QwenishDecoderLayer) and type(model.layers[0]) is QwenishDecoderLayer
    t.route[1, 0, 0] = _entry(1, 0, NO_END, 2.0)
    t.tok_row[:3] = 1
    x, pos = torch.randn(3, H), torch.arange(3)
    h, r = model.layers[2](pos, x, None)
    # the stream h + r moves by the vector, added to the layer's own output; the residual is untouched
    assert torch.equal(r, x)
    torch.testing.assert_close(h, model.layers[2].lin(x) + 2.0 * t.bank[1])


class HFStyleDecoderLayer(nn.Module):  # the Transformers modeling backend: no vLLM positions
    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        return hidden_states


class HybridDecoderLayer(QwenishDecoderLayer):  # positions after the stream, as in Qwen3Next
    def forward(self, hidden_states, residual, positions):
        return super().forward(positions, hidden_states, residual)


def test_only_layers_taking_positions_are_found_and_positions_are_read_by_name():
    model = Model(3)
    model.layers[0] = HFStyleDecoderLayer()
    model.layers[1] = HybridDecoderLayer()
    found = decoder_layers(model)
    assert sorted(found) == [1, 2]
    t = _tables(armed=1)
    arm(found, anchors(found, [1], CPU), t)
    t.route[1, 0, 0] = _entry(1, 2, 3, 1.0)  # slot 1 on positions [2, 3)
    t.tok_row[:3] = 1
    x, pos = torch.randn(3, H), torch.tensor([0, 1, 2])
    h, r = model.layers[1](x, None, pos)
    torch.testing.assert_close(h + r, model.layers[1].lin(x) + x + torch.stack([torch.zeros(H), torch.zeros(H), t.bank[1]]))


def test_steered_layer_compiles_without_graph_breaks():
    model = Model(1)
    t = _tables(armed=1)
    found = decoder_layers(model)
    arm(found, anchors(found, [0], CPU), t)
    layer = model.layers[0]
    explain = torch._dynamo.explain(layer)(torch.arange(4), torch.randn(4, H), None)
    assert explain.graph_break_count == 0 and explain.graph_count == 1


def test_arming_adds_no_input_to_the_compiled_forward():
    """The compiled forward takes exactly the inputs it takes without the plugin: each input is
    one more slot in the frames that run the forward and stay on the stack under every launch in
    it, and 31 more moved the end of CPython's frame-stack chunk into vLLM's attention launch
    (``steer_op``, "Why the tables are found through an anchor")."""

    def compiled_inputs(model: Model) -> tuple[int, str]:
        seen = []

        def backend(gm, example_inputs):
            seen.append((len(example_inputs), gm.code))
            return gm

        def forward(pos, x):
            r = None
            for layer in model.layers:
                x, r = layer(pos, x, r)
            return x + r + pos[:, None]  # vLLM's forward reads the positions anyway (rotary)

        torch._dynamo.reset()
        torch.compile(forward, backend=backend, fullgraph=True)(torch.arange(4), torch.randn(4, H))
        (got,) = seen
        return got

    plain = compiled_inputs(Model(3))
    model = Model(3)
    found = decoder_layers(model)
    t = _tables(armed=3)
    arm(found, anchors(found, [0, 1, 2], CPU), t)
    armed = compiled_inputs(model)
    assert armed[1].count("hotwire.steer_") == 3
    assert armed[0] == plain[0]


def test_anchors_are_distinct_even_where_layers_share_a_weight():
    """A weight shared between layers cannot tell them apart: each layer's anchor is one of its
    own, and a layer with none of its own is left out."""
    model = Model(3)
    model.layers[1].lin.bias = model.layers[0].lin.bias  # the last parameter of layers 0 and 1: one tensor
    model.layers[2].lin = model.layers[1].lin  # each of layer 2's parameters is another layer's anchor
    found = decoder_layers(model)
    paths = anchors(found, [0, 1, 2], CPU)
    assert sorted(paths) == [0, 1]
    ptrs = {i: found[i].get_parameter(".".join(p)).data_ptr() for i, p in paths.items()}
    assert len(set(ptrs.values())) == 2


def test_a_parameter_on_another_device_is_never_an_anchor():
    """vLLM's offloading without a device view keeps a parameter in host memory and runs the
    forward on a fresh copy of it, at a new address each time: the anchor is one on the engine's
    device ("meta" stands in for the host here, the CPU for the engine's device)."""
    model = Model(1)
    model.layers[0].lin.bias = nn.Parameter(torch.empty(H, device="meta"))  # the last parameter
    found = decoder_layers(model)
    assert anchors(found, [0], CPU) == {0: ("lin", "weight")}
    assert anchors(found, [0], torch.device("meta")) == {0: ("lin", "bias")}


def test_armed_layers_trace_to_one_graph():
    # vLLM compiles each piece of the model between attention ops; pieces that trace to the same
    # graph share one inductor compile. A layer index baked into the graph would make every
    # armed layer's piece unique (and start-up grow with the layers armed).
    model = Model(3)
    found = decoder_layers(model)
    arm(found, anchors(found, [0, 2], CPU), _tables(armed=2))
    codes = []

    def backend(gm, example_inputs):
        codes.append(gm.code)
        return gm

    for i in (0, 2):
        torch._dynamo.reset()
        torch.compile(model.layers[i], backend=backend, fullgraph=True)(torch.arange(4), torch.randn(4, H), None)
    assert len(codes) == 2 and "hotwire.steer" in codes[0]
    assert codes[0] == codes[1]


def _random_tables(n, h, dtype, device, armed=3, entries=4, slots=6, seed=0):
    """Random bank, residual and per-token routing ``[n, armed, entries, 8]`` for ``n`` tokens,
    every mode mixed; about half the entries are on, a fifth of tokens none."""
    g = torch.Generator().manual_seed(seed)
    bank = torch.randn(slots + 1, h, generator=g).to(dtype)
    bank[0] = 0
    shape = (n, armed, entries)
    lo = torch.randint(0, 40, shape, generator=g)
    hi = lo + torch.randint(0, 40, shape, generator=g)
    rows = torch.randint(1, slots + 1, shape, generator=g)
    mode = torch.randint(0, 4, shape, generator=g)
    a = torch.randn(shape, generator=g) / torch.where(mode == ADD, 1.0, float(h) ** 0.5)
    clo = torch.randn(shape, generator=g)
    chi = clo + torch.rand(shape, generator=g)
    f = torch.stack([a, clo, chi, torch.zeros(shape)], -1).view(torch.int32)
    route = torch.cat([torch.stack([rows, lo, hi, mode], -1).int(), f], -1)
    route[torch.rand(n, generator=g) < 0.2] = 0  # tokens of unsteered requests: the null row
    route[-1, :, 0] = _entry(1, 0, NO_END, 0.5)  # the last token: always on
    if n > 1:
        route[0] = 0  # the first: never on (x[0] holds signed zeros)
    pos = torch.randint(0, 80, (n,), generator=g)
    x = torch.randn(n, h, generator=g).to(dtype)
    x[0, :2] = torch.tensor([-0.0, 0.0], dtype=dtype)
    residual = (4 * torch.randn(n, h, generator=g)).to(dtype)
    return [t.to(device) for t in (x, residual, pos, bank, route)]


def _mixed(route: torch.Tensor) -> torch.Tensor:
    """``tok_row`` for :func:`_random_tables`' rows: the first and last token keep their own, the
    ones between read them in reverse (the kernel follows each token's row, not its index)."""
    n = route.shape[0]
    tok = each_token(route)
    tok[1:-1] = tok[1:-1].flip(0)
    return tok


def test_op_registration_is_consistent_with_its_fake():
    x, residual, pos, bank, route = _random_tables(9, H, torch.float32, "cpu")
    for res in (residual, None):
        args = (x, res, pos, bank, route[:, 1], _mixed(route))  # a layer's strided view, as armed layers have
        opcheck(*args)
        assert torch.equal(op(*args), reference(*args))
        assert not torch.equal(reference(*args)[-1], x[-1])


def test_an_anchor_bound_to_no_layer_is_an_error():
    x, residual, pos, bank, route = _random_tables(4, H, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="no armed layer is bound"):
        torch.ops.hotwire.steer_(x, residual, pos, torch.empty(1))


def _inference_op(x, residual, pos, bank, route, tok_row):
    """The registered op on a copy of ``x`` in inference mode, as vLLM's forward calls it: past
    the dispatcher (``steer_op._call_past_the_dispatcher``)."""
    out = x.clone()
    anchor, layer = bound(bank, route, tok_row)
    with torch.inference_mode():
        torch.ops.hotwire.steer_.default(out, residual, pos, anchor)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_inference_call_steers_as_a_dispatched_one(device):
    """In inference mode a plain call skips the dispatcher and runs the kernel it would pick: the
    same bits as the dispatched call, with and without a residual, on a layer's strided view."""
    x, residual, pos, bank, route = _random_tables(9, 64 if device == "cpu" else 1024, torch.float32, device)
    for res in (residual, None):
        at = (x, res, pos, bank, route[:, 1], _mixed(route))
        assert torch.equal(_inference_op(*at).view(torch.int32), op(*at).view(torch.int32))
        assert not torch.equal(_inference_op(*at), x)


def test_an_inference_call_of_the_op_keeps_the_gil():
    """The dispatcher lets the GIL go on the way to the op's Python kernel, on every armed layer of
    a step run without a CUDA graph; a plain inference call goes past it (tests/gil_probe.py):
    calls in an idle step, and on a layer no request steers. The anchor is a parameter, as the
    armed layers' anchors are."""
    from gil_probe import SLOW_S, longest_call

    x, residual, pos, bank, route = _random_tables(64, H, torch.float32, "cpu")
    tok, state = _mixed(route), steer_op.StepState(None, 2)
    state.route_layers([0])
    layers = [steer_op.ArmedLayer(bank, route[:, i], tok, state, i) for i in (0, 1)]
    anchors = [nn.Parameter(torch.empty(1)) for _ in layers]
    for anchor, layer in zip(anchors, layers):
        steer_op.bind(anchor, layer)
    calls = [(True, anchors[0]), (False, anchors[1])]  # an idle step, then a layer no request steers

    def call(k: int) -> None:
        idle, anchor = calls[k % 2]
        idle_graphs.select(idle)
        torch.ops.hotwire.steer_.default(x, residual, pos, anchor)

    try:
        with torch.inference_mode():
            took = longest_call(call)
    finally:
        idle_graphs.select(False)
    assert took < SLOW_S, f"a call took {took:.3f} s: it let the GIL go"


@pytest.mark.gpu
def test_a_steered_layers_launch_by_the_driver_keeps_the_gil(monkeypatch):
    """In a step run without a CUDA graph the op launches its kernel on each steered layer, where
    Triton's launch lets the GIL go around the driver's call (and vLLM's output thread may take
    it); the driver's launch through ``ctypes.PyDLL`` keeps it (engine_plugin/steer_triton.py).
    (Triton's release lasts a few microseconds: the probe would see it only now and then.)"""
    from gil_probe import SLOW_S, longest_call
    from hotwire.engine_plugin import driver_launch, steer_triton

    monkeypatch.setattr(steer_triton, "_LAUNCHES", {})
    x, residual, pos, bank, route = _random_tables(256, 1024, torch.bfloat16, "cuda", seed=4)
    state = steer_op.StepState(None, 1)
    layer = steer_op.ArmedLayer(bank, route[:, 0], _mixed(route), state, 0)
    anchor = nn.Parameter(torch.empty(1, device="cuda"), requires_grad=False)
    steer_op.bind(anchor, layer)
    with torch.inference_mode():
        steer_op.steer_(x, residual, pos, anchor)  # Triton compiles and launches it once
        took = longest_call(lambda k: steer_op.steer_(x, residual, pos, anchor))
        torch.cuda.synchronize()
    assert [type(f) for f in steer_triton._LAUNCHES.values()] == [driver_launch.DriverLaunch]
    assert took < SLOW_S, f"a launch took {took:.3f} s: it let the GIL go"


def test_a_profiled_call_still_shows_the_op():
    """Under the profiler the call goes through the dispatcher, so traces name ``hotwire::steer_``."""
    x, residual, pos, bank, route = _random_tables(4, H, torch.float32, "cpu")
    anchor, layer = bound(bank, route[:, 0], _mixed(route))
    with torch.profiler.profile() as prof, torch.inference_mode():
        torch.ops.hotwire.steer_.default(x.clone(), residual, pos, anchor)
    assert any(e.name == "hotwire::steer_" for e in prof.events())


def _counting_triton_launches(monkeypatch) -> list:
    """A list that gets one item per launch of the steering kernel by Triton (not by the driver)."""
    from hotwire.engine_plugin import steer_triton

    launches, run = [], steer_triton._steer.run

    def counted(*args, **kwargs):
        launches.append(1)
        return run(*args, **kwargs)

    monkeypatch.setattr(steer_triton._steer, "run", counted)
    return launches


@pytest.mark.gpu
@pytest.mark.parametrize("by", ["the driver", "Triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,h", [(1, 1024), (7, 1000), (300, 4096)])
def test_triton_kernel_matches_the_reference(n, h, dtype, by, monkeypatch):
    """Each specialisation launched by Triton once, then by the driver (engine_plugin/steer_triton.py);
    by Triton every time where the driver cannot be used."""
    from hotwire.engine_plugin import driver_launch, steer_triton

    monkeypatch.setattr(steer_triton, "_LAUNCHES", {})
    if by == "Triton":
        monkeypatch.setattr(driver_launch, "_driver", lambda: None)
    by_triton = _counting_triton_launches(monkeypatch)
    x, residual, pos, bank, route = _random_tables(n, h, dtype, "cuda", seed=n)
    for layer, res in zip(range(route.shape[1]), (residual, None, residual)):
        tok = _mixed(route)
        at = (x, res, pos, bank, route[:, layer], tok)  # strided, read through each token's row, as in the engine
        before = len(by_triton)
        got = op(*at)
        assert torch.equal(op(*at), got)  # the second launch: by the driver where it can be
        # by the driver: layer 2 is layer 0's specialisation (a residual), compiled already
        assert len(by_triton) - before == (2 if by == "Triton" else 0 if layer == 2 else 1)
        want = reference(*[a.cpu() if a is not None else None for a in at])
        mine = route[tok.long(), layer]
        off = ~((pos[:, None] >= mine[:, :, 1]) & (pos[:, None] < mine[:, :, 2])).any(1)
        assert (off.any() or n == 1) and not off.all()
        # tokens with no entry on: every bit of x, signed zeros included
        assert torch.equal(got[off].cpu().view(torch.uint8), x[off].cpu().view(torch.uint8))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2)
        opcheck(*at)


@pytest.mark.gpu
def test_a_call_with_an_unaligned_address_is_launched_by_triton(monkeypatch):
    """The driver launches the kernel Triton compiled for 16-byte aligned addresses; a call with an
    address that is not (a view starting one float in) must not get it."""
    from hotwire.engine_plugin import steer_triton

    monkeypatch.setattr(steer_triton, "_LAUNCHES", {})
    by_triton = _counting_triton_launches(monkeypatch)
    n, h = 5, 1024
    x, residual, pos, bank, route = _random_tables(n, h, torch.float32, "cuda", seed=2)
    at = (residual, pos, bank, route[:, 0], _mixed(route))
    op(x, *at)
    op(x, *at)
    assert len(by_triton) == 1  # compiled once, then the driver's
    shifted = torch.empty(n * h + 1, device="cuda")[1:].view(n, h)  # steered in place, where it is
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 and shifted.is_contiguous()
    anchor, layer = bound(*at[2:])
    torch.ops.hotwire.steer_(shifted, residual, pos, anchor)
    assert len(by_triton) == 2
    want = reference(x.cpu(), *[a.cpu() for a in at])
    torch.testing.assert_close(shifted.cpu(), want, rtol=1e-5, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_kernel_saturates_like_the_reference(dtype):
    top = torch.finfo(dtype).max
    x, residual, pos, bank, route = _random_tables(64, 1024, dtype, "cuda", seed=3)
    bank[1:] = top  # every entry that is on now overflows
    for layer in range(route.shape[1]):
        at = (x, residual, pos, bank, route[:, layer], _mixed(route))
        got = op(*at)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.cpu(), reference(*[a.cpu() if a is not None else None for a in at]), rtol=1e-2, atol=0)


@pytest.mark.parametrize("spec,want", [("all", [0, 1, 2, 3]), ("1,3", [1, 3]), ("0-2", [0, 1, 2]),
                                       ("2, 9, 1-1", [1, 2])])
def test_layer_selection(spec, want):
    from hotwire.engine_plugin.config import HotwireConfig

    assert HotwireConfig(layers=spec).armed_layers(4) == want


def test_compile_salt_names_the_op_source():
    from hotwire.engine_plugin import salts

    digest = salts.op_digest()
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert f"op={digest}" in salts.compile_salt(None)
    src = b"".join((Path(salts.__file__).parent / f).read_bytes() for f in salts._OP_SOURCES)
    assert b"hotwire::steer" in src and b"@triton.jit" in src  # the op and its kernel are both hashed


_INTERPRETED = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_steering_op import _random_tables, reference
from hotwire.engine_plugin import steer_triton


def launch(x, residual, pos, bank, route, tok_row=None, scratch=None):
    out = x.clone()
    tok_row = torch.arange(route.shape[0], dtype=torch.int32) if tok_row is None else tok_row
    steer_triton.launch(out, residual, pos, bank, route, tok_row, scratch)
    return out


for n, h in [(1, 64), (7, 100), (5, 1088)]:
    for dtype in (torch.float32, torch.bfloat16):
        x, res, pos, bank, route = _random_tables(n, h, dtype, "cpu", seed=n)
        for layer, r in zip(range(3), (res, None, res)):
            got, want = launch(x, r, pos, bank, route[:, layer]), reference(x, r, pos, bank, route[:, layer])
            off = ~((pos[:, None] >= route[:, layer, :, 1]) & (pos[:, None] < route[:, layer, :, 2])).any(1)
            assert torch.equal(got[off].view(torch.uint8), x[off].view(torch.uint8)), (n, h, dtype)
            torch.testing.assert_close(got, want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-2)
from test_steering_op import _gated_case
x, res, bank, route0, route1, tok, scratch = _gated_case()
mine = type(scratch)(*(s.clone() for s in scratch))
pos = torch.arange(8)
for prompt in (False, True):  # token gates, then the same as a prompt gate decided on token 0
    if prompt:
        route0, route1 = route0.clone(), route1.clone()
        route0[:, 0, 2] = 1
        route0[:, :, 7] = -route0[:, :, 7]
        route1[:, :, 7] = -route1[:, :, 7]
    for route in (route0, route1):
        want, got = reference(x, res, pos, bank, route, tok, scratch), launch(x, res, pos, bank, route, tok, mine)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert all(torch.equal(a[:8], b[:8]) for a, b in zip(scratch, mine)), (scratch, mine)
print("kernel ok")
"""


def test_triton_kernel_matches_the_reference_in_the_interpreter():
    """The CUDA kernel's code, run by Triton's interpreter on the CPU: every mode, with and without
    a residual, several blocks per token (the GPU test repeats this on the H200)."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", _INTERPRETED.format(tests=str(Path(__file__).parent))],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "kernel ok" in run.stdout, run.stderr[-3000:]


_REFUSED_BY_THE_DRIVER = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_steering_op import _random_tables, reference
from refused_launch import refuse_every_launch
from hotwire.engine_plugin import steer_triton

tries = refuse_every_launch()
x, res, pos, bank, route = _random_tables(7, 64, torch.float32, "cpu", seed=7)
tok = torch.arange(7, dtype=torch.int32)
want = reference(x, res, pos, bank, route[:, 0])
for _ in range(3):  # Triton's launch; the driver's, refused, then Triton's; Triton's
    got = x.clone()
    steer_triton.launch(got, res, pos, bank, route[:, 0], tok)
    torch.testing.assert_close(got, want)
assert list(steer_triton._LAUNCHES.values()) == [None], steer_triton._LAUNCHES
assert tries == [7], tries  # the driver was asked once
print("fallback ok")
"""


def test_a_launch_the_driver_refuses_falls_back_to_triton_for_good():
    """A driver error on the steering kernel's launch must not take the engine down when Triton
    can launch it: the call steers all the same, and Triton launches that specialisation from then
    on (the driver is not asked again). (Triton's interpreter stands in for the GPU.)"""
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", _REFUSED_BY_THE_DRIVER.format(tests=str(Path(__file__).parent))],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "fallback ok" in run.stdout, run.stderr[-3000:]


def _gated_case(seed=5):
    """Probe row 2 on layer-position 0 records gate 1; layer-position 1 adds row 1 under gate 1;
    layer-position 0 also ablates row 1 under the same gate (a gate on its own probe layer)."""
    from hotwire.engine_plugin.interventions import PROBE
    from hotwire.engine_plugin.steer_op import GateScratch

    g = torch.Generator().manual_seed(seed)
    n = 8
    x, res = torch.randn(n, H, generator=g), torch.randn(n, H, generator=g)
    bank = torch.zeros(3, H)
    bank[1], bank[2] = torch.randn(H, generator=g), torch.randn(H, generator=g)
    probe = _entry(2, 0, NO_END, 1 / float(bank[2].norm()), PROBE, clo=0.1)
    probe[7] = 1
    ablate = _mode_entry({"mode": "ablate"}, 1, bank)
    ablate[7] = 1
    add = _entry(1, 0, NO_END, 2.0)
    add[7] = 1
    route0, route1 = torch.zeros(5, 2, 8, dtype=torch.int32), torch.zeros(5, 2, 8, dtype=torch.int32)
    route0[3] = torch.stack([probe, ablate])  # every token is request row 3's
    route1[3, 0] = add
    tok = torch.full((16,), 3, dtype=torch.int32)
    scratch = GateScratch(torch.full((16, 2), 7, dtype=torch.int32), torch.zeros(5, 2, dtype=torch.int32),
                          torch.zeros(5, 2, dtype=torch.int32))
    return x, res, bank, route0, route1, tok, scratch


def test_a_gate_opens_where_the_probe_layer_projects_above_its_threshold():
    x, res, bank, route0, route1, tok, scratch = _gated_case()
    pos = torch.arange(8)
    u = bank[2] / bank[2].norm()
    opened = (x + res) @ u > 0.1  # the stream at the probe layer, before its own entries
    assert 0 < opened.sum() < 8
    out0 = reference(x, res, pos, bank, route0, tok, scratch)
    assert torch.equal(scratch.gates[:8, 0].bool(), opened)
    assert scratch.counts[3].tolist() == [int(opened.sum()), 0]  # counted on the tokens' request row
    v1 = bank[1] / bank[1].norm()
    want0 = x - torch.where(opened[:, None], ((x + res) @ v1)[:, None] * v1, 0.0)  # same-layer gate
    torch.testing.assert_close(out0, want0, rtol=1e-5, atol=1e-5)
    assert torch.equal(out0[~opened], x[~opened])  # closed: every bit
    out1 = reference(out0, res, pos, bank, route1, tok, scratch)  # a later layer reads the recorded gate
    torch.testing.assert_close(out1, out0 + torch.where(opened[:, None], 2.0 * bank[1], 0.0))
    assert torch.equal(out1[~opened], out0[~opened])
    assert torch.equal(reference(x, res, pos, bank, route0, tok), x)  # no scratch: no gate opens


def test_a_prompt_gate_decides_on_the_prompts_last_token_and_holds():
    """Gate word -1: the probe runs on position 5 only (the prompt's last token, as admission
    writes it) and its decision, kept per request row, opens the gated add on later steps."""
    x, res, bank, route0, route1, tok, scratch = _gated_case()
    u = bank[2] / bank[2].norm()
    h = x + res
    last = int(torch.nonzero(h @ u > 0.1)[0])  # a token whose stream opens the gate
    route0 = route0.clone()
    route0[:, 0, 1:3] = torch.tensor([last, last + 1])  # the probe: that token only
    route0[:, :, 7] = -1
    route1 = route1.clone()
    route1[:, 0, 1] = last  # the gated add: from that token on
    route1[:, :, 7] = torch.tensor([-1, 0])
    pos = torch.arange(8)
    out0 = reference(x, res, pos, bank, route0, tok, scratch)
    assert scratch.decided[3].tolist() == [1, 0] and scratch.counts[3].tolist() == [1, 0]
    out1 = reference(out0, res, pos, bank, route1, tok, scratch)
    later = pos >= last
    torch.testing.assert_close(out1[later], out0[later] + 2.0 * bank[1])
    assert torch.equal(out1[~later], out0[~later])
    # a later step (decode: one token at a new position) reads the held decision
    x2, r2 = torch.randn(1, H), torch.randn(1, H)
    step = reference(x2, r2, torch.tensor([9]), bank, route1, tok, scratch)
    torch.testing.assert_close(step, x2 + 2.0 * bank[1])
    scratch.decided.zero_()  # a closed decision: nothing
    assert torch.equal(reference(x2, r2, torch.tensor([9]), bank, route1, tok, scratch), x2)


def test_the_op_finds_its_gate_scratch_through_its_anchor():
    t = _tables(entries=2)
    x, res, bank, route0, route1, _, _ = _gated_case()
    t.bank[: bank.shape[0]] = bank
    t.tok_row[:8] = 2
    t.route[2, 0] = route0[3]
    out = steered(t, 0, x, res, torch.arange(8))
    opened = (x + res) @ (bank[2] / bank[2].norm()) > 0.1
    assert torch.equal(t.gates[:8, 0].bool(), opened) and t.gate_counts[2, 0] == opened.sum()
    assert not torch.equal(out, x)


def test_the_op_runs_only_on_the_layers_the_step_has_entries_on():
    """A step run without a CUDA graph calls the op on every armed layer; on a layer no request of
    the step has an entry on it returns before any launch. Until the first routed step every layer
    runs (CUDA-graph capture and warm-up passes)."""
    t = _tables(armed=2)
    t.route[1, 0, 0] = _entry(1, 0, NO_END, 2.0)
    t.route[1, 1, 0] = _entry(2, 0, NO_END, -1.0)
    t.tok_row[:4] = 1
    x, pos = torch.randn(4, H), torch.arange(4)
    both = [steered(t, i, x, None, pos) for i in (0, 1)]
    assert not torch.equal(both[0], x) and not torch.equal(both[1], x)
    t.step.route_layers([1])
    assert torch.equal(steered(t, 0, x, None, pos), x)  # not live: untouched
    assert torch.equal(steered(t, 1, x, None, pos), both[1])
    t.step.route_layers([])
    assert torch.equal(steered(t, 1, x, None, pos), x)


def test_the_op_writes_steered_tokens_in_place_and_leaves_the_rest_alone():
    x, residual, pos, bank, route = _random_tables(9, H, torch.float32, "cpu")
    want = reference(x, residual, pos, bank, route[:, 1])
    steered_rows = ~torch.all(want == x, dim=1)
    assert 0 < steered_rows.sum() < 9
    y = x.clone()
    ptr = y.data_ptr()
    anchor, layer = bound(bank, route[:, 1])
    assert torch.ops.hotwire.steer_(y, residual, pos, anchor) is None
    assert y.data_ptr() == ptr and torch.equal(y, want)
    assert torch.equal(y[~steered_rows].view(torch.int32), x[~steered_rows].view(torch.int32))


def test_the_op_does_nothing_while_idle_graphs_skip_it():
    """An idle step (no token routed) and the idle capture pass: the op launches nothing."""
    x, residual, pos, bank, route = _random_tables(9, H, torch.float32, "cpu")
    try:
        idle_graphs.select(True)
        assert torch.equal(op(x, residual, pos, bank, route[:, 1]), x)
    finally:
        idle_graphs.select(False)
    assert not torch.equal(op(x, residual, pos, bank, route[:, 1]), x)


def test_inductor_steers_the_layer_output_in_place_without_a_copy():
    """The functionalized in-place op is re-inplaced onto the layer's output buffer: the compiled
    code calls it on that buffer and copies nothing (a copy would be a kernel on every step,
    graphs without the op included)."""
    from torch._inductor.utils import run_and_get_code

    model = Model(2)
    t = _tables(armed=2)
    found = decoder_layers(model)
    arm(found, anchors(found, [0, 1], CPU), t)
    t.route[1, 0, 0] = _entry(1, 0, NO_END, 2.0)
    t.tok_row[:4] = 1

    def forward(pos, x):
        h, r = model.layers[0](pos, x, None)
        h, r = model.layers[1](pos, h, r)
        return h + r

    pos, x = torch.arange(4), torch.randn(4, H)
    with torch.no_grad():
        want = forward(pos, x)
        torch._dynamo.reset()
        got, (code, *_) = run_and_get_code(torch.compile(forward, fullgraph=True), pos, x)
    torch.testing.assert_close(got, want)
    calls = [line for line in code.splitlines() if "hotwire.steer_" in line and "(" in line and "#" not in line]
    assert len(calls) == 2, code
    assert "clone" not in code and ".copy_(" not in code, code
