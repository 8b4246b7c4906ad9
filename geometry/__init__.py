"""losslens.geometry: curvature and loss surfaces of any differentiable loss."""
