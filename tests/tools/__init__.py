"""CPU tests of tools/: build_cubins.py and the manifest, gpu_run.sh, tree_digest.py, mutate_reference.py."""
