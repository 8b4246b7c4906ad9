"""A Hessian written by hand: one-hidden-layer tanh MLP with mean softmax cross-entropy (test oracle).

Test-only (no library code or benchmark needs it), so it lives with the tests; the loss-value
oracle that benchmarks also use is :mod:`losslens.lm.models.oracles`. No autograd anywhere below.

Model: z₁ = W₁x + b₁ [h], a = tanh(z₁), z₂ = W₂a + b₂ [C], p = softmax(z₂), ℓ = −log p_y,
L = (1/N) Σ_n ℓ_n. Parameters θ = (W₁ [h, d], b₁ [h], W₂ [C, h], b₂ [C]) flattened row-major in that
order (``nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, C))``'s parameter order).

Per example, with σ' = 1 − a², σ'' = −2a(1 − a²), r = p − e_y (∂ℓ/∂z₂), S = diag(p) − ppᵀ (∂²ℓ/∂z₂²)
and J = ∂z₂/∂θ [C, P]:

    ∂z₂_k/∂W₁[j, m] = W₂[k, j] σ'_j x_m      ∂z₂_k/∂b₁[j] = W₂[k, j] σ'_j
    ∂z₂_k/∂W₂[k', j] = [k = k'] a_j          ∂z₂_k/∂b₂[k'] = [k = k']

    ∇²ℓ = Jᵀ S J + Σ_k r_k ∇²z₂_k, where the only non-zero second derivatives of z₂_k are
    ∂²z₂_k/∂W₁[j, m]∂W₁[j, m'] = W₂[k, j] σ''_j x_m x_m'   (b₁: x → 1, same hidden unit j only)
    ∂²z₂_k/∂W₂[k, j]∂W₁[j, m]  = σ'_j x_m                   (b₁: x_m → 1)
"""

from __future__ import annotations

import torch


def mlp_hessian(
    W1: torch.Tensor, b1: torch.Tensor, W2: torch.Tensor, b2: torch.Tensor, X: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The Hessian [P, P] (float64) of the mean cross-entropy of the tanh MLP above on (X [N, d], y [N])."""
    W1, b1, W2, b2, X = (t.detach().to(torch.float64) for t in (W1, b1, W2, b2, X))
    h, d = W1.shape
    C = W2.shape[0]
    N = X.shape[0]
    sizes = [h * d, h, C * h, C]
    P = sum(sizes)
    o_b1, o_W2, o_b2 = sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2]
    H = torch.zeros(P, P, dtype=torch.float64)
    eye_C = torch.eye(C, dtype=torch.float64)
    for n in range(N):
        x = X[n]
        a = torch.tanh(W1 @ x + b1)
        d1 = 1 - a * a
        d2 = -2 * a * d1
        z2 = W2 @ a + b2
        p = torch.exp(z2 - z2.max())
        p = p / p.sum()
        r = p.clone()
        r[int(y[n])] -= 1
        S = torch.diag(p) - torch.outer(p, p)

        J = torch.zeros(C, P, dtype=torch.float64)
        J[:, :o_b1] = ((W2 * d1)[:, :, None] * x[None, None, :]).reshape(C, h * d)
        J[:, o_b1:o_W2] = W2 * d1
        J[:, o_W2:o_b2] = (eye_C[:, :, None] * a[None, None, :]).reshape(C, C * h)
        J[:, o_b2:] = eye_C
        Hn = J.T @ S @ J

        # Σ_k r_k ∇²z₂_k: first layer with itself (block-diagonal over hidden units j)
        c = (W2.T @ r) * d2  # [h]
        xt = torch.cat([x, torch.ones(1, dtype=torch.float64)])  # x with the bias input
        first = c[:, None, None] * xt[None, :, None] * xt[None, None, :]  # [j, m, m'] over (W1[j, :], b1[j])
        idx = [torch.cat([torch.arange(j * d, (j + 1) * d), torch.tensor([o_b1 + j])]) for j in range(h)]
        for j in range(h):
            Hn[idx[j][:, None], idx[j][None, :]] += first[j]
        # second layer weights with the first layer: ∂²z₂_k/∂W₂[k, j]∂(W₁[j, m] | b₁[j]) = σ'_j x̃_m
        for k in range(C):
            for j in range(h):
                row = o_W2 + k * h + j
                vals = r[k] * d1[j] * xt
                Hn[row, idx[j]] += vals
                Hn[idx[j], row] += vals
        H += Hn
    return H / N


def mlp_parameters(model: torch.nn.Sequential) -> tuple[torch.Tensor, ...]:
    """(W1, b1, W2, b2) of ``nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, C))``."""
    return model[0].weight, model[0].bias, model[2].weight, model[2].bias
