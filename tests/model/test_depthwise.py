import pytest
import torch
from torch import nn

from openalign import presets
from openalign.model.depthwise import _DepthwiseConv, _tap_matrix, use_fast_depthwise
from openalign.model.dual_encoder import DualEncoder


@pytest.mark.parametrize("size,kernel,padding", [(2, 5, "same"), (4, 5, "same"), (4, 3, 1), (3, 5, 2)])
def test_direct_weight_gradient_matches_the_library_convolution(size, kernel, padding):
    torch.manual_seed(0)
    ref = nn.Conv2d(6, 6, kernel, padding=padding, groups=6, bias=False).double()
    fast = nn.Conv2d(6, 6, kernel, padding=padding, groups=6, bias=False).double()
    fast.load_state_dict(ref.state_dict())
    assert use_fast_depthwise(fast) == 1
    x = torch.randn(5, 6, size, size, dtype=torch.float64)
    grad = torch.randn(5, 6, size, size, dtype=torch.float64)
    out = []
    for conv in (ref, fast):
        xi = x.clone().requires_grad_()
        y = conv(xi)
        y.backward(grad)
        out.append((y.detach(), xi.grad, conv.weight.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    weight = fast.weight.detach().clone().requires_grad_()
    pad = kernel // 2 if padding == "same" else padding
    assert torch.autograd.gradcheck(lambda a, w: _DepthwiseConv.apply(a, w, 1, pad),
                                    (x[:2].clone().requires_grad_(), weight))


def test_tap_matrix_links_each_output_to_the_inputs_under_its_kernel():
    taps = _tap_matrix(2, 2, 2, 2, 3, 1, 1).reshape(2, 2, 2, 2, 3, 3)
    # output (0, 0) sees input (1, 1) through the kernel's bottom-right tap, and output (1, 1) sees input
    # (0, 0) through its top-left tap; every (output, input) pair of a 2x2 map is within a 3x3 kernel's reach
    assert taps[0, 0, 1, 1, 2, 2] == 1 and taps[1, 1, 0, 0, 0, 0] == 1
    assert taps.sum() == 16 and (taps.sum((-1, -2)) == 1).all()


def test_efficientnet_routes_its_stride_one_depthwise_layers_and_keeps_its_state_dict():
    cfg = presets.get("tiny")
    model = DualEncoder(cfg.model, cfg.loss)
    keys = set(model.state_dict())
    depthwise = [m for m in model.align.vision_model.modules()
                 if isinstance(m, nn.Conv2d) and m.groups > 1 and m.stride == (1, 1)]
    assert depthwise and all("forward" in vars(m) for m in depthwise)
    assert set(model.state_dict()) == keys
    # routing again finds them already routed and changes nothing observable
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model.encode_image(pixels).embeds
        use_fast_depthwise(model.align.vision_model)
        torch.testing.assert_close(model.encode_image(pixels).embeds, before)


def test_bf16_autocast_on_cpu_keeps_the_library_path():
    conv = nn.Conv2d(4, 4, 5, padding="same", groups=4, bias=False)
    use_fast_depthwise(conv)
    x = torch.randn(2, 4, 2, 2, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and conv.weight.grad.dtype == torch.float32
