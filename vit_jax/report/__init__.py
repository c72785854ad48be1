"""Reports: the compute-versus-accuracy report of a sweep and the ViT paper's model analyses (Fig. 6 and 7)."""
