"""The compiler's blocks: attention (GQA, MLA), MLP (dense, MoE) and the model's input
and output head, chosen per model and layer by :mod:`.registry`."""
