#!/usr/bin/env bash
# Regenerate the bundled sample profiles with the project's own capture (deterministic workloads;
# timestamps of the system profiles and host facts differ run to run).
#   bash sample_profiles/regenerate.sh [path/to/neuron-profile]
# Stack frames record absolute source paths and the viewer tests expect the main checkout's
# (/work/main/...): run it with that checkout's code, e.g. from another worktree
#   (cd /work/main && PYTHONPATH=/work/main bash /path/to/worktree/sample_profiles/regenerate.sh)
# then look at the viewer snapshots it changes before updating them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
np="${1:-neuron-profile}"
export NEURONSCOPE_LIVE=0
"$np" capture --workload bert-layer --instance trn1.2xlarge -o "$here/bert-layer" --force
"$np" capture --workload llama-decode --instance trn1.32xlarge --tp 2 --timing-only \
    -o "$here/llama-decode-tp2" --force
"$np" capture --workload matmul --instance trn2.48xlarge --timing-only --device-only \
    -o "$here/matmul-trn2" --force
