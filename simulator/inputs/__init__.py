"""Inputs: the typed schema of the YAML files and their loading with file:line:key errors."""
