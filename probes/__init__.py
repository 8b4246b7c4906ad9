"""losslens.probes: language-model measurements built on geometry."""
