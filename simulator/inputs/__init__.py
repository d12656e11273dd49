"""Inputs: the typed schema of the YAML files and their loading with file:line:key errors;
readers of what users already have (`nvidia-smi topo -m`, NCCL's topology XML) and the
topology YAML imported from them."""
