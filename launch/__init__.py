"""Launchers for TPU pods (gcloud) and SLURM GPU clusters; stdlib only, so --help is instant."""
