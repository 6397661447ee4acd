"""The site's side of SCAFFOLD (clients/site/site_scaffold.py, clients/training/scaffold.py): the
corrected step and option II checked by hand on one linear layer, c_i kept across a restart,
Delta c_i through a top-k codec with its own error feedback, and the policy's refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.policy import PolicyRefusal, SitePolicy, load_policy
from clients.site.policy_check import Request, check_request
from clients.site.site_scaffold import (CONTROL_NAME, RESIDUAL_NAME, ControlVariateError,
                                        control_reply, received_control, split_control)
from clients.site.state_store import SiteStateStore
from clients.training.trainer import backward_step
from strategies.compression import decode, encode
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError

X = np.array([[1.0, 2.0]], np.float32)  # the received model: one linear layer, no bias
C = np.array([0.5, -1.0], np.float32)  # the server's c
C_I = np.array([1.0, 1.0], np.float32)  # the site's c_i
LR = 0.1


def _instruction(**changes) -> Instruction:
    config = {keys.SERVER_ROUND: 1, keys.FEDERATION: "fed", keys.CONTROL_VARIATES: "scaffold",
              keys.CONTROL_CODEC: "none", **changes}
    return Instruction.parse("train", config, SiteRunSettings.from_run_config({}), "run-1")


def _one_step(state_dir):
    """One corrected SGD step of ``0.5 (w . a)^2`` at ``a = (1, 1)``: the gradient is
    ``(w . a) a = (3, 3)``; returns the site's control variates and the trained weight."""
    SiteStateStore(state_dir).save("fed", CONTROL_NAME, C_I)
    control = received_control(encode(C, "none"), _instruction(), {"weight": X}, state_dir)
    model = nn.Linear(2, 1, bias=False)
    model.weight.data = torch.as_tensor(X.copy())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loss = 0.5 * model(torch.ones(1, 2)).pow(2).sum()
    backward_step(loss, optimizer, model=model, step_hooks=control.hooks({"weight"}))
    return control, model.weight.detach().numpy()


def test_a_step_is_corrected_by_c_minus_c_i(tmp_path):
    _, y = _one_step(tmp_path)
    # y = x - eta (g - c_i + c) = (1, 2) - 0.1 ((3, 3) - (1, 1) + (0.5, -1)) = (0.75, 1.9)
    np.testing.assert_allclose(y, [[0.75, 1.9]], rtol=1e-6)


def test_option_two_gives_the_new_c_i(tmp_path):
    control, y = _one_step(tmp_path)
    c_i_plus = control.updated({"weight": X - y}, {"weight"}, steps_norm=1.0, lr=LR)
    # c_i+ = c_i - c + (x - y) / (K eta) = (1, 1) - (0.5, -1) + (0.25, 0.1) / 0.1 = (3, 3),
    # the gradient itself after one step
    np.testing.assert_allclose(c_i_plus, [3.0, 3.0], rtol=1e-5)


def test_buffers_hold_zero_and_are_not_corrected(tmp_path):
    arrays = {"weight": X, "running_var": np.ones(2, np.float32), "count": np.zeros((), np.int64)}
    c = np.array([0.5, -1.0, 7.0, 7.0], np.float32)
    control = received_control(encode(c, "none"), _instruction(), arrays, tmp_path)
    assert control.names == ["weight", "running_var"]
    assert set(control.hooks({"weight"}).correction) == {"weight"}
    moved = {"weight": np.zeros((1, 2), np.float32), "running_var": np.ones(2, np.float32)}
    np.testing.assert_array_equal(control.updated(moved, {"weight"}, 1.0, LR)[2:], [0, 0])


def test_c_i_survives_a_restart(tmp_path):
    first = received_control(encode(C, "none"), _instruction(), {"weight": X}, tmp_path)
    np.testing.assert_array_equal(first.c_i, [0, 0])  # nothing held yet: c_i = 0
    payload = control_reply(first, np.array([2.0, -3.0], np.float32), _instruction(), tmp_path)
    np.testing.assert_array_equal(decode(payload, "none", 2), [2.0, -3.0])  # Delta c_i
    # a new process: the control variate is read back from the state dir
    again = received_control(encode(C, "none"), _instruction(), {"weight": X}, tmp_path)
    np.testing.assert_array_equal(again.c_i, [2.0, -3.0])
    other = received_control(encode(C, "none"), _instruction(**{keys.FEDERATION: "other"}),
                             {"weight": X}, tmp_path)
    np.testing.assert_array_equal(other.c_i, [0, 0])  # keyed by federation


def test_delta_c_i_is_sent_through_top_k_with_its_own_error_feedback(tmp_path):
    top = _instruction(**{keys.CODEC: "topk:0.5", keys.CODEC_SEED: 3})
    arrays = {"weight": np.zeros((1, 4), np.float32)}
    control = received_control(encode(np.zeros(4), "none"), top, arrays, tmp_path)
    first = np.array([4.0, 1.0, -3.0, 0.5], np.float32)
    sent = decode(control_reply(control, first, top, tmp_path), "topk:0.5", 4)
    np.testing.assert_array_equal(sent, [4.0, 0, -3.0, 0])
    store = SiteStateStore(tmp_path)
    residual = store.load("fed", RESIDUAL_NAME)
    np.testing.assert_array_equal(residual, [0, 1.0, 0, 0.5])  # what top-k left out
    assert store.load("fed", "ef-residual") is None  # apart from the update's residual
    # the next round carries the residual: z = residual + Delta c_i
    control = received_control(encode(np.zeros(4), "none"), top, arrays, tmp_path)
    np.testing.assert_array_equal(control.c_i, first)  # c_i+ itself was kept, not C(Delta)
    second = first + np.array([0.0, 0.5, 0.0, 0.0], np.float32)
    sent = decode(control_reply(control, second, top, tmp_path), "topk:0.5", 4)
    np.testing.assert_array_equal(sent, [0, 1.5, 0, 0.5])
    np.testing.assert_array_equal(store.load("fed", RESIDUAL_NAME), [0, 0, 0, 0])


def test_an_instruction_without_c_or_with_adam_is_refused(tmp_path):
    with pytest.raises(ControlVariateError, match="without 'scaffold-c'"):
        received_control(None, _instruction(), {"weight": X}, tmp_path)
    with pytest.raises(ControlVariateError, match="optimizer = 'adam'"):
        received_control(encode(C, "none"), _instruction(), {"weight": X}, tmp_path, "adam")
    with pytest.raises(ConfigError, match="'control-variates' = 'fedprox'"):
        _instruction(**{keys.CONTROL_VARIATES: "fedprox"})
    model, payload = split_control({"model": np.zeros(3), keys.CONTROL_C: np.ones(2, np.uint8)})
    assert list(model) == ["model"] and payload is not None


def test_the_site_policy_may_refuse_to_share_control_variates(tmp_path):
    request = Request(task="cxr-cls", image_size=32, control_variates="scaffold")
    check_request(SitePolicy.permissive(), "train", request)  # the default allows it
    path = tmp_path / "policy.toml"
    path.write_text("share-control-variates = false\n", encoding="utf-8")
    policy = load_policy(path)
    with pytest.raises(PolicyRefusal, match="share-control-variates") as refused:
        check_request(policy, "train", request)
    assert refused.value.rule == "share-control-variates"
    check_request(policy, "train", Request(task="cxr-cls", image_size=32))  # plain rounds pass
