"""``torch.optim.Muon`` whose Newton-Schulz products run in float32 on a CPU, rounded to bfloat16 as torch's are.

torch 2.13's Muon orthogonalises each update in bfloat16 (``torch/optim/_muon.py``,
``_zeropower_via_newtonschulz``: ``grad.bfloat16()``, then ``@`` and ``torch.addmm`` on bf16 matrices). On a CPU
without bf16 arithmetic (AVX2 only, as the machines this project tests on) torch computes those products in a generic
kernel: five iterations on a 512 x 1536 matrix took 4.6 s there against 0.14 s with the same products done by the
float32 BLAS (one thread, 2026-11-30), and in ``specfmt train eagle3`` on the example world this orthogonalisation was
about a third of every step.

:class:`Muon` keeps torch's algorithm, settings and state (``momentum_buffer``; a saved state loads into either class)
and replaces only how each product of the iteration is computed on a CPU: from the same bf16 operands, in float32
(which holds each bf16 x bf16 product exactly) with one rounding to bf16 at the end, as a bf16 GEMM accumulates in
float32. Each product then equals torch's own up to the order of its float32 sums; the iteration amplifies those
last-bit differences, so the orthogonalised update agrees with torch's to bf16's precision (``tests/test_train_muon.py``),
not bit for bit (a bf16 product's last bits depend on its kernel's order of sums on any device). Off the CPU,
torch's own function runs unchanged.
"""

from __future__ import annotations

import torch
from torch.optim import _muon


def orthogonalize(update: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float) -> torch.Tensor:
    """The quintic Newton-Schulz orthogonalisation of ``update`` (A x B, 2-D): torch's, with float32 products on a CPU.

    ``X = G / |G|_F`` (the wide way round), then ``ns_steps`` times ``X <- aX + (bM + cM^2)X`` with ``M = XX^T``,
    every value in bfloat16 as in ``torch/optim/_muon.py::_zeropower_via_newtonschulz`` (Keller Jordan's Muon,
    https://kellerjordan.github.io/posts/muon/). On a CPU each ``torch.addmm``/``@`` of it takes float32 copies of its
    bf16 operands and rounds its result to bf16 once; on any other device this is torch's function.

    Returns:
        the orthogonalised update, bfloat16, A x B.

    Raises:
        ValueError: as torch's function: ``update`` not 2-D, ``ns_steps`` >= 100, or not three coefficients.
    """
    if update.device.type != "cpu":
        return _muon._zeropower_via_newtonschulz(update, ns_coefficients, ns_steps, eps)
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if update.ndim != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        xf = x.float()
        gram = (xf @ xf.T).bfloat16().float()
        gram_update = torch.addmm(gram, gram, gram, beta=b, alpha=c).bfloat16().float()
        x = torch.addmm(xf, gram_update, xf, beta=a).bfloat16()
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` with :func:`orthogonalize` in place of torch's Newton-Schulz function.

    The update is torch 2.13's ``_single_tensor_muon``: the momentum buffer lerped towards the gradient, Nesterov's
    look-ahead, the orthogonalised update scaled by ``adjust_lr_fn`` and decoupled weight decay. Constructor, settings,
    ``state_dict`` and the class name are torch's.
    """

    @torch.no_grad()
    def step(self, closure=None):
        """One optimisation step over every parameter with a gradient; returns ``closure()``'s loss, if given.

        Raises:
            ValueError: a gradient that is not 2-D, or a complex parameter (as torch's ``Muon``).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            if self._init_group(group, params, grads, bufs):
                raise ValueError("Complex parameters are not supported")
            lr, momentum = group["lr"], group["momentum"]
            if isinstance(lr, torch.Tensor) and lr.dim() != 0:  # a 1-element tensor rate, read as torch's ``_to_scalar`` reads it
                lr = lr.squeeze()
            for param, grad, buf in zip(params, grads, bufs):
                if grad.ndim != 2:
                    raise ValueError("Param gradient must be a 2D matrix")
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update, alpha=-_muon._adjust_lr(lr, group["adjust_lr_fn"], param.shape))
        return loss


__all__ = ["Muon", "orthogonalize"]
