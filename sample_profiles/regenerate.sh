#!/usr/bin/env bash
# Regenerate the bundled sample profiles with the project's own capture (deterministic workloads;
# timestamps of the system profiles and host facts differ run to run).
#   bash sample_profiles/regenerate.sh [path/to/neuron-profile]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
np="${1:-neuron-profile}"
export NEURONSCOPE_LIVE=0
"$np" capture --workload bert-layer --instance trn1.2xlarge -o "$here/bert-layer" --force
"$np" capture --workload llama-decode --instance trn1.32xlarge --tp 2 --timing-only \
    -o "$here/llama-decode-tp2" --force
"$np" capture --workload matmul --instance trn2.48xlarge --timing-only --device-only \
    -o "$here/matmul-trn2" --force
