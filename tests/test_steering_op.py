"""The steering op and its tables, on CPU tensors, against a direct computation."""

import pytest
import torch
from torch import nn

from hotwire.engine_plugin.steering import SteeringTables, arm, decoder_layers

H = 16


def _tables(requests=4, entries=2, armed=2):
    t = SteeringTables(slots=8, hidden=H, armed=armed, requests=requests, entries=entries,
                       max_tokens=32, dtype=torch.float32, device=torch.device("cpu"))
    torch.manual_seed(0)
    t.bank[1:] = torch.randn(8, H)
    return t


def test_unsteered_tokens_are_returned_bit_for_bit():
    t = _tables()
    x = torch.randn(5, H)
    x[0, :3] = torch.tensor([-0.0, 0.0, 1e-38])  # signed zeros and denormals survive too
    out = t(x, torch.arange(5), 0)
    assert torch.equal(out, x) and torch.equal(torch.signbit(out), torch.signbit(x))


def test_entries_add_scaled_rows_on_their_positions_only():
    t = _tables()
    # request row 1: layer-position 0 has two entries: bank row 3 on all positions, bank row 5 on [2, 4)
    t.route[1, 0, 0] = torch.tensor([3, 0, 2**31 - 1], dtype=torch.int32)
    t.route[1, 0, 1] = torch.tensor([5, 2, 4], dtype=torch.int32)
    t.coef[1, 0] = torch.tensor([1.5, -2.0])
    t.tok_row[:6] = torch.tensor([0, 1, 1, 1, 1, 0], dtype=torch.int32)  # tokens 1-4 belong to request row 1
    t.load_tokens(6)
    x, pos = torch.randn(6, H), torch.tensor([9, 0, 1, 2, 3, 4])
    out = t(x, pos, 0)
    want = x.clone()
    for tok in range(1, 5):
        want[tok] += 1.5 * t.bank[3]
        if 2 <= pos[tok] < 4:
            want[tok] += -2.0 * t.bank[5]
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert torch.equal(out[0], x[0]) and torch.equal(out[5], x[5])
    assert torch.equal(t(x, pos, 1), x)  # the other armed layer has no entries


def test_steered_request_keeps_its_bits_outside_its_window():
    t = _tables()
    t.route[1, 0, 0] = torch.tensor([3, 100, 200], dtype=torch.int32)  # a window no token is in
    t.coef[1, 0, 0] = 2.0
    t.tok_row[:4] = 1
    t.load_tokens(4)
    x = torch.randn(4, H).to(torch.bfloat16)
    x[0, :2] = torch.tensor([-0.0, 0.0])
    out = t.to(torch.bfloat16)(x, torch.arange(4), 0)
    assert torch.equal(out.view(torch.int16), x.view(torch.int16))  # every bit, signed zeros included


def test_load_tokens_nulls_the_stale_tail():
    t = _tables()
    t.route[1, 0, 0] = torch.tensor([3, 0, 2**31 - 1], dtype=torch.int32)
    t.coef[1, 0, 0] = 1.0
    t.tok_row[:4] = 1
    t.load_tokens(4)
    x = torch.randn(4, H)
    assert not torch.equal(t(x, torch.arange(4), 0)[3], x[3])
    t.load_tokens(2, stale=4)  # the batch shrank to two tokens
    assert torch.equal(t(x, torch.arange(4), 0)[2:], x[2:])
    assert t.tok_route[2:4].abs().sum() == 0 and t.tok_coef[2:4].abs().sum() == 0


def test_mrope_positions_use_the_first_row():
    t = _tables()
    t.route[1, 0, 0] = torch.tensor([2, 3, 4], dtype=torch.int32)
    t.coef[1, 0, 0] = 1.0
    t.tok_row[:2] = 1
    t.load_tokens(2)
    x = torch.zeros(2, H)
    out = t(x, torch.tensor([[3, 4], [0, 0], [0, 0]]), 0)
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
    armed = arm(found, [2], t)
    assert armed.layers == (2,) and armed.position(2) == 0 and armed.position(0) is None
    assert [n for n, _ in model.named_parameters()] == names
    assert isinstance(model.layers[2], QwenishDecoderLayer) and type(model.layers[0]) is QwenishDecoderLayer
    t.route[1, 0, 0] = torch.tensor([1, 0, 2**31 - 1], dtype=torch.int32)
    t.coef[1, 0, 0] = 2.0
    t.tok_row[:3] = 1
    t.load_tokens(3)
    x, pos = torch.randn(3, H), torch.arange(3)
    h, r = model.layers[2](pos, x, None)
    torch.testing.assert_close(r, x + 2.0 * t.bank[1])


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
    arm(found, [1], t)
    t.route[1, 0, 0] = torch.tensor([1, 2, 3], dtype=torch.int32)  # slot 1 on positions [2, 3)
    t.coef[1, 0, 0] = 1.0
    t.tok_row[:3] = 1
    t.load_tokens(3)
    x, pos = torch.randn(3, H), torch.tensor([0, 1, 2])
    _, r = model.layers[1](x, None, pos)
    torch.testing.assert_close(r, x + torch.stack([torch.zeros(H), torch.zeros(H), t.bank[1]]))


def test_steered_layer_compiles_without_graph_breaks():
    model = Model(1)
    t = _tables(armed=1)
    arm(decoder_layers(model), [0], t)
    layer = model.layers[0]
    explain = torch._dynamo.explain(layer)(torch.arange(4), torch.randn(4, H), None)
    assert explain.graph_break_count == 0 and explain.graph_count == 1


@pytest.mark.parametrize("spec,want", [("all", [0, 1, 2, 3]), ("1,3", [1, 3]), ("0-2", [0, 1, 2]),
                                       ("2, 9, 1-1", [1, 2])])
def test_layer_selection(spec, want):
    from hotwire.engine_plugin.config import HotwireConfig

    assert HotwireConfig(layers=spec).armed_layers(4) == want
