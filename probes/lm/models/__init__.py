"""Models: architecture families, the second-order check, the LM Hessian and weight statistics.

- :mod:`.families`     -- :data:`FAMILIES` and :func:`tiny_model`: tiny random-init models of the
  seed studies' six architectures (GPT-NeoX, OLMo, OLMo2, SmolLM3, Apertus, Llama);
- :mod:`.second_order` -- :func:`check_second_order` / :func:`ensure_second_order`: whether the
  HVP backends give the true Hessian of a model (against finite differences), and
  :func:`curvature_safe`; :mod:`.second_order_report` -- what it found (``SecondOrderReport``, ``BackendCheck``);
- :mod:`.oracles`      -- :class:`~.oracles.LossOracle`: vᵀHv, uᵀHv and Hessian blocks from loss values only
  (Richardson second differences in float64, no autograd), and :func:`~.oracles.float64_everywhere`;
- :mod:`.curvature`    -- :func:`lm_hessian`: the checked :class:`losslens.geometry.HessianOperator` of the LM loss;
- :mod:`.zero_embeddings` -- :func:`~.zero_embeddings.zero_embedding_tokens`: tokens whose input-embedding
  row is zero (padding), left out of every curvature loss (the first normalisation is singular there);
- :mod:`.weights`      -- :func:`weight_kurtosis`: excess kurtosis of the quantized weight matrices.

Loading checkpoints is :mod:`losslens.lm.checkpoints`; finding blocks and linears is :mod:`losslens.lm.core.modules`.
"""
